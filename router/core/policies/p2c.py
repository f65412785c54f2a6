"""Power of two choices on in-flight requests: sample two distinct, keep the less busy
(load.in_flight_share)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase
from gpuroute.router.core.policies.load import in_flight_share


class PowerOfTwoChoices(PolicyBase):
    name: ClassVar[str] = "p2c"

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i = ctx.rng.randrange(n)
        j = ctx.rng.randrange(n - 1)
        if j >= i:
            j += 1  # distinct second sample
        a, b = candidates[i], candidates[j]
        load_a, load_b = in_flight_share(ctx, a), in_flight_share(ctx, b)
        if load_a == load_b:
            return a  # a is itself a uniform sample, so ties stay unbiased
        return a if load_a < load_b else b

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return in_flight_share(ctx, backend)
