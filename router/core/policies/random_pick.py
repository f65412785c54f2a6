"""Uniform random choice (a baseline; the RNG is injected)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase


class RandomPick(PolicyBase):
    name: ClassVar[str] = "random"

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        return candidates[ctx.rng.randrange(len(candidates))]

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return None
