"""Least outstanding work: the backend that would finish this request soonest.

Score = load.work_seconds: (outstanding GPU-seconds + the larger of the agent's and the
peers' view of other work + this request's cost on that GPU) × slowness / warm-up factor.
Small pools are scanned in full; large pools sample `choices` candidates (P2C
generalised). The pick is the lowest, or one of the `pick_among` lowest where replicas
share one view (stages.AmongLowest)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase, check, trace_scores
from gpuroute.router.core.policies.load import work_seconds
from gpuroute.router.core.policies.sampling import CandidateSampler
from gpuroute.router.core.policies.stages import AmongLowest, AmongLowestConfig, config_of


@dataclass(frozen=True, slots=True)
class LeastOutstandingWorkSettings:
    """`[policy_settings.least_outstanding_work]` (docs/configuration.md)."""

    full_scan_max: int = 64  # pools up to this size are scanned in full
    choices: int = 4  # candidates sampled from larger pools
    pick_among: int = 1  # >1: random among the best k (the router: redis.pick_among)

    def __post_init__(self) -> None:
        check(self.full_scan_max >= 1, "full_scan_max", "must be >= 1")
        check(self.choices >= 2, "choices", "must be >= 2")
        self.picker_config()  # the picker's config checks pick_among

    def picker_config(self) -> AmongLowestConfig:
        return config_of(AmongLowestConfig, self, among="pick_among")


class LeastOutstandingWork(PolicyBase):
    name: ClassVar[str] = "least_outstanding_work"
    Settings: ClassVar[type] = LeastOutstandingWorkSettings
    traces_scores: ClassVar[bool] = True

    def __init__(
        self, settings: LeastOutstandingWorkSettings = LeastOutstandingWorkSettings()
    ) -> None:
        self.sampler = CandidateSampler(settings.full_scan_max, settings.choices)
        self.picker = AmongLowest(settings.picker_config())

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        considered = self.sampler.sample(ctx, candidates)
        scores = [work_seconds(ctx, b) for b in considered]
        trace_scores(ctx, considered, scores)
        return self.picker.pick(ctx, considered, scores)

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return work_seconds(ctx, backend)
