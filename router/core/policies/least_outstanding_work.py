"""Least outstanding work (the default): the backend that would finish this request soonest.

Score = PickContext.work_score: (outstanding GPU-seconds + the larger of the agent's and
the peers' view of other work + this request's cost on that GPU) × slowness / warm-up
factor. Small pools are scanned in full; large pools sample `choices` candidates (P2C
generalised)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import (
    PickContext,
    PolicyBase,
    min_with_random_ties,
    trace_scores,
)
from gpuroute.router.core.policies.sampling import CandidateSampler


class LeastOutstandingWork(PolicyBase):
    name: ClassVar[str] = "least_outstanding_work"
    traces_scores: ClassVar[bool] = True

    def __init__(self, full_scan_max: int = 64, choices: int = 4, pick_among: int = 1) -> None:
        if full_scan_max < 1 or choices < 2 or pick_among < 1:
            raise ValueError("full_scan_max must be >= 1, choices >= 2, pick_among >= 1")
        self.sampler = CandidateSampler(full_scan_max, choices)
        # >1 when replicas share state: replicas deciding on the same (slightly stale) view
        # spread over the best few instead of all landing on the single minimum
        self.pick_among = pick_among

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        considered = self.sampler.sample(ctx, candidates)
        scores = [ctx.work_score(b) for b in considered]
        trace_scores(ctx, considered, scores)
        if self.pick_among > 1 and len(considered) > 1:
            ranked = sorted(range(len(considered)), key=scores.__getitem__)
            return considered[ranked[ctx.rng.randrange(min(self.pick_among, len(ranked)))]]
        return min_with_random_ties(considered, scores, ctx.rng)

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return ctx.work_score(backend)
