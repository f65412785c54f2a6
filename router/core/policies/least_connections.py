"""Least connections, weighted like HAProxy's `leastconn`: fewest in-flight per capacity
(load.connection_share)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase, min_with_random_ties
from gpuroute.router.core.policies.load import connection_share


class LeastConnections(PolicyBase):
    name: ClassVar[str] = "least_connections"

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        scores = [connection_share(ctx, b) for b in candidates]
        return min_with_random_ties(candidates, scores, ctx.rng)

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return connection_share(ctx, backend)
