"""Prefix affinity: send a prompt where its longest prefix is already in the KV cache.

An approximate index maps prompt-block hashes (chained, so a hit at depth d means the first d
blocks match) to the backend that last received them, bounded in size (LRU). The score is
least-outstanding-work with the cached blocks' prefill removed from the cost. A hard load
guard excludes a backend whose work exceeds `guard_factor` × the candidates' mean plus
`guard_slack_s`, so a hot prefix spreads to other backends instead of piling onto one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import (
    PickContext,
    PolicyBase,
    check,
    min_with_random_ties,
    trace_scores,
)
from gpuroute.router.core.policies.load import work_seconds
from gpuroute.router.core.policies.prefix_index import PrefixIndex
from gpuroute.router.core.policies.sampling import CandidateSampler

from gpuroute.prefix_blocks import BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class PrefixAffinitySettings:
    """`[policy_settings.prefix_affinity]` (docs/configuration.md)."""

    max_blocks: int = 1_000_000  # the prefix index's size (block hashes)
    guard_factor: float = 1.5  # a holder past this x the mean work is not favoured...
    guard_slack_s: float = 1.0  # ...plus this many seconds
    full_scan_max: int = 64  # pools up to this size are scanned in full
    choices: int = 4  # candidates sampled from larger pools (prefix holders besides)

    def __post_init__(self) -> None:
        check(self.max_blocks >= 1, "max_blocks", "must be >= 1")
        check(self.guard_factor >= 1, "guard_factor", "must be >= 1")
        check(self.guard_slack_s >= 0, "guard_slack_s", "must be >= 0")
        check(self.full_scan_max >= 1, "full_scan_max", "must be >= 1")
        check(self.choices >= 2, "choices", "must be >= 2")


class PrefixAffinity(PolicyBase):
    name: ClassVar[str] = "prefix_affinity"
    Settings: ClassVar[type] = PrefixAffinitySettings
    needs: ClassVar[frozenset[str]] = frozenset({"prefix_blocks"})
    traces_scores: ClassVar[bool] = True

    def __init__(self, settings: PrefixAffinitySettings = PrefixAffinitySettings()) -> None:
        self.prefix_index = PrefixIndex(settings.max_blocks)
        self.guard_factor = settings.guard_factor
        self.guard_slack_s = settings.guard_slack_s
        self.sampler = CandidateSampler(settings.full_scan_max, settings.choices)

    def _considered(
        self, ctx: PickContext, candidates: Sequence[Backend], matched: dict[str, int]
    ) -> Sequence[Backend]:
        """LOW's candidates (all, or a sample of a large pool) plus every prefix holder."""
        considered = self.sampler.sample(ctx, candidates)
        if considered is candidates or not matched:
            return considered
        seen = {b.backend_id for b in considered}
        return [
            *considered,
            *(b for b in candidates if b.backend_id in matched and b.backend_id not in seen),
        ]

    def _cost(self, ctx: PickContext, backend: Backend, cached_blocks: int) -> float:
        cost = ctx.cost_on(backend)
        if cached_blocks:
            prompt = ctx.request.prompt_tokens
            cached = min(prompt, cached_blocks * BLOCK_TOKENS)
            rates = ctx.estimator.rates(backend.gpu_type)
            per_token = rates.prefill_s_per_token if rates else 0.0
            cost = max(cost - cached * per_token, 0.0)
        return cost

    def scores(
        self, ctx: PickContext, candidates: Sequence[Backend]
    ) -> tuple[Sequence[Backend], list[float]]:
        blocks = ctx.request.prefix_blocks
        matched = self.prefix_index.matches(blocks) if blocks else {}
        considered = self._considered(ctx, candidates, matched)
        loads = [work_seconds(ctx, b) for b in considered]
        limit = self.guard_factor * (sum(loads) / len(loads)) + self.guard_slack_s
        scores = []
        for backend, load in zip(considered, loads, strict=True):
            depth = matched.get(backend.backend_id, 0)
            if depth and load <= limit:
                scores.append(work_seconds(ctx, backend, self._cost(ctx, backend, depth)))
            else:
                scores.append(load)  # no hit, or guarded: plain least outstanding work
        return considered, scores

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        considered, scores = self.scores(ctx, candidates)
        trace_scores(ctx, considered, scores)
        chosen = min_with_random_ties(considered, scores, ctx.rng)
        if ctx.request.prefix_blocks:
            self.prefix_index.record(ctx.request.prefix_blocks, chosen.backend_id)
        return chosen

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        depth = self.prefix_index.matches(ctx.request.prefix_blocks).get(backend.backend_id, 0)
        return work_seconds(ctx, backend, self._cost(ctx, backend, depth))
