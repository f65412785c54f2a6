"""Round robin: each candidate in turn, blind to load and capacity (a baseline)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase


class RoundRobin(PolicyBase):
    name: ClassVar[str] = "round_robin"

    def __init__(self) -> None:
        self._counter = 0

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        backend = candidates[self._counter % len(candidates)]
        self._counter += 1
        return backend

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return None
