"""Least connections, weighted like HAProxy's `leastconn`: fewest in-flight per capacity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase, min_with_random_ties


class LeastConnections(PolicyBase):
    name: ClassVar[str] = "least_connections"

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        scores = [(b.in_flight + 1) / ctx.capacity_of(b) for b in candidates]
        return min_with_random_ties(candidates, scores, ctx.rng)

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return (backend.in_flight + 1) / ctx.capacity_of(backend)
