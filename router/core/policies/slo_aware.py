"""SLO-aware placement (the default): filter the backends predicted to meet the request's
SLO, then pick among them by a score of load and cost.

Pipeline, as llm-d's filter → scorer → picker:
- candidates: all of a small pool; of a large one, the `per_type` least-loaded of a random
  sample of each GPU type, plus every prefix holder (so a sampled pool still sees each kind
  of GPU and the caches);
- prediction (core/latency.py): TTFT and TPOT on each, with the prefix cache's expected hit
  taken off the prompt (a prefix hit shortens predicted TTFT; that is the prefix scorer)
  and a gray-failing backend's slowness stretching its compute;
- filter: predicted TTFT ≤ margin × the class's TTFT (less what it waited) and TPOT ≤
  margin × its TPOT, where the margin of each GPU type starts at `margin` and follows the
  met-rate of what that type was sent (TypeMargins), so a biased or noisy prediction
  tightens itself, and one kind of GPU's misses do not close the others;
- score (lower wins): the predicted TTFT as a share of the class's bound (stretched by the
  backend's warm-up, as least outstanding work weighs it), plus the stall
  its prefill inflicts on the streams running there (each one's share of a TPOT budget
  its chunks take: what keeps long prompts off backends full of short answers), plus
  `cost_weight` × its cost in dollars there relative to the cheapest that fits;
- pick: the lowest score (ties at random);
- a session's remembered backend is taken while it is predicted to meet the SLO;
- when none is predicted to meet it: the least-violating backend, marked as a miss, which
  SLO-aware admission holds or refuses instead of sending.

The filters and scorers are plug-ins (stages.py, adapter_affinity.py), each built from its
typed config, which `Settings` fills (docs/configuration.md, `[policy_settings.slo_aware]`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.latency import Prediction
from gpuroute.router.core.policies.adapter_affinity import AdapterAffinity, AdapterAffinityConfig
from gpuroute.router.core.policies.base import (
    PickContext,
    PolicyBase,
    PolicyFacts,
    Shortlist,
    Verdict,
    check,
)
from gpuroute.router.core.policies.load import request_share
from gpuroute.router.core.policies.prefix_index import PrefixIndex
from gpuroute.router.core.policies.sampling import CandidateSampler
from gpuroute.router.core.policies.stages import (
    AmongLowest,
    CostShare,
    Filter,
    Rows,
    Scorer,
    SloFit,
    SloFitConfig,
    StallGuard,
    StallShare,
    TtftShare,
    WeightConfig,
    config_of,
    run_filters,
    share_of_slo,
    total_scores,
    waited,
)
from gpuroute.router.core.slo import SloClass

from gpuroute.gpus import GPU_SPECS
from gpuroute.prefix_blocks import BLOCK_TOKENS

# $/hour per GPU type: the data sheets' rough prices (gpuroute/gpus.py); they only rank types
# against each other: set your own in [slo] gpu_prices or a [[gpu_types]] price_per_hour
DEFAULT_GPU_PRICES: dict[str, float] = {
    name: spec.price_per_hour for name, spec in GPU_SPECS.items() if spec.price_per_hour
}


@dataclass(frozen=True, slots=True)
class SloAwareSettings:
    """`[policy_settings.slo_aware]` (docs/configuration.md)."""

    margin: float = 0.9  # SloFit: a backend fits when predicted <= margin x the SLO
    cost_weight: float = 0.1  # CostShare's weight against the TTFT share
    ttft_weight: float = 1.0  # TtftShare's weight
    stall_weight: float = 1.0  # StallShare's weight
    full_scan_max: int = 24  # pools up to this size are predicted in full
    per_type: int = 1  # of a larger pool: the least loaded this many of each GPU type...
    sample_per_type: int = 3  # ...of this many drawn from it
    max_blocks: int = 1_000_000  # the prefix index's size (block hashes)
    adapter_width: int = 1  # AdapterAffinity: a LoRA adapter's home set while quiet
    adapter_headroom: float = 0.5  # a home backend has room while TTFT <= this x the SLO's
    adapter_shrink_after_s: float = 30.0  # a grown home set shrinks by one per quiet period

    def __post_init__(self) -> None:
        # the plug-ins' configs check their own settings (an error names the key here)
        for key in ("cost_weight", "ttft_weight", "stall_weight"):
            self.weight_config(key)
        for key in ("full_scan_max", "per_type", "max_blocks"):
            check(getattr(self, key) >= 1, key, "must be >= 1")
        check(self.sample_per_type >= self.per_type, "sample_per_type", "must be >= per_type")
        self.fit_config()
        self.adapter_config()

    def weight_config(self, key: str) -> WeightConfig:
        """A scorer's weight: `cost_weight`, `ttft_weight` or `stall_weight`."""
        return config_of(WeightConfig, self, weight=key)

    def fit_config(self) -> SloFitConfig:
        return config_of(SloFitConfig, self, margin="margin")

    def adapter_config(self) -> AdapterAffinityConfig:
        return config_of(
            AdapterAffinityConfig, self, width="adapter_width", headroom="adapter_headroom",
            shrink_after_s="adapter_shrink_after_s",
        )  # fmt: skip


class SloAware(PolicyBase):
    name: ClassVar[str] = "slo_aware"
    Settings: ClassVar[type] = SloAwareSettings
    needs: ClassVar[frozenset[str]] = frozenset({"prefix_blocks"})
    predicts_slo: ClassVar[bool] = True
    traces_scores: ClassVar[bool] = True

    def __init__(
        self, settings: SloAwareSettings = SloAwareSettings(), facts: PolicyFacts | None = None
    ) -> None:
        s = settings
        self.sampler = CandidateSampler(
            s.full_scan_max, s.sample_per_type, per_type_keep=s.per_type
        )
        self.prefix_index = PrefixIndex(s.max_blocks)
        self.fit = SloFit(s.fit_config())
        self.adapters = AdapterAffinity(s.adapter_config())
        self.filters: tuple[Filter, ...] = (self.fit, StallGuard(), self.adapters)
        prices = {**DEFAULT_GPU_PRICES, **(facts.gpu_prices if facts else {})}
        self.scorers: tuple[Scorer, ...] = (
            TtftShare(s.weight_config("ttft_weight")),
            StallShare(s.weight_config("stall_weight")),
            CostShare(s.weight_config("cost_weight"), prices),
        )
        self.picker = AmongLowest()

    @classmethod
    def from_settings(cls, settings: SloAwareSettings, facts: PolicyFacts) -> SloAware:
        return cls(settings, facts)

    # -- sample ----------------------------------------------------------------------------
    def considered(
        self, ctx: PickContext, candidates: Sequence[Backend], matched: dict[str, int]
    ) -> Sequence[Backend]:
        """All of a small pool; of a large one, the least loaded few of a sample of each
        GPU type, and every prefix holder."""
        sampled = self.sampler.sample(ctx, candidates, functools.partial(request_share, ctx))
        if sampled is candidates or not (matched or ctx.request.adapter):
            return sampled
        _, by_id = self.sampler.by_type(candidates)
        holders = [by_id[i] for i in matched if i in by_id]
        holders += self.adapters.home(ctx, candidates)  # its adapter's home set
        return [*sampled, *(b for b in dict.fromkeys(holders) if b not in sampled)]

    # -- predict ---------------------------------------------------------------------------
    def predictions(
        self, ctx: PickContext, considered: Sequence[Backend], matched: dict[str, int]
    ) -> Rows:
        """Each backend with its predicted TTFT and TPOT; a prefix hit there takes the
        cached blocks off the prompt to prefill."""
        request, latency, trace = ctx.request, ctx.latency, ctx.trace
        assert latency is not None  # the scheduler builds one for policies that predict
        prompt, output, predict, now = (
            request.prompt_tokens,
            ctx.expected_output,
            latency.predict,
            ctx.now,
        )
        rows = {}
        for b in considered:
            depth = matched.get(b.backend_id, 0)
            uncached = max(1, prompt - depth * BLOCK_TOKENS) if depth else prompt
            rows[b] = p = predict(b, uncached, prompt, output, now)
            if trace is not None:
                trace.row(b).update(cached_blocks=depth, **_predicted(p))
        return rows

    # -- filter ----------------------------------------------------------------------------
    def shortlist(self, ctx: PickContext, candidates: Sequence[Backend]) -> Shortlist:
        """The backends every filter kept (predicted to meet the request's SLO, sparing the
        streams running there, in its adapter's home set); nothing kept and the nearest
        miss as `miss` when a filter keeps none."""
        blocks = ctx.request.prefix_blocks
        matched = self.prefix_index.matches(blocks) if blocks else {}
        rows = self.predictions(ctx, self.considered(ctx, candidates, matched), matched)
        wait = waited(ctx)
        fits, nearest = run_filters(ctx, self.filters, rows)
        if nearest is not None:
            return Shortlist((), miss=Verdict(*nearest, fits=False), waited=wait)
        ctx.shortlist = shortlist = Shortlist(list(fits), fits, waited=wait)
        return shortlist

    # -- score and pick --------------------------------------------------------------------
    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        """The lowest total score among the shortlist's fits (its shortlist made now when
        the scheduler did not run that stage first)."""
        shortlist = ctx.shortlist
        if shortlist is None:
            shortlist = self.shortlist(ctx, candidates)
            if shortlist.miss is not None:
                return shortlist.miss.backend
        assert shortlist.predictions is not None
        scores = total_scores(ctx, self.scorers, shortlist.predictions)
        return self.picker.pick(ctx, shortlist.kept, scores)

    def placed(self, ctx: PickContext, backend: Backend, *, preferred: bool) -> Verdict:
        """It goes there: the margin it needed is kept for its verdict, and the prefix
        index learns that the backend now holds its blocks."""
        shortlist = ctx.shortlist
        assert shortlist is not None and shortlist.predictions is not None
        prediction = shortlist.predictions[backend]
        needed = needed_margin(prediction, ctx.slo, shortlist.waited)
        blocks = ctx.request.prefix_blocks
        if blocks:
            self.prefix_index.record(blocks, backend.backend_id)
        if ctx.trace is not None:
            ctx.trace.margin = round(needed, 4)
        return Verdict(backend, prediction, fits=True, preferred=preferred, needed=needed)

    def observe_slo(
        self, needed: float | None, met: bool, backend: Backend, now: float, slo: str = ""
    ) -> None:
        """A request of class `slo` this policy placed on `backend` finished: the SLO
        filter's margin for its GPU type learns of it (SloFit.observe)."""
        self.fit.observe(needed, met, backend.gpu_type, now, slo)

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        """The larger predicted fraction of its SLO there (what the filter compares), with
        the prefix cache's hit there taken off the prompt as the filter takes it."""
        blocks = ctx.request.prefix_blocks
        matched = self.prefix_index.matches(blocks) if blocks else {}
        (p,) = self.predictions(ctx, [backend], matched).values()
        return share_of_slo(p, ctx.slo)


def needed_margin(p: Prediction, slo: SloClass, waited: float) -> float:
    """The tightest margin that still admits this prediction (for its verdict)."""
    return max((p.ttft_s + waited) / slo.ttft_s, p.tpot_s / slo.tpot_s)


def _predicted(p: Prediction) -> dict[str, float]:
    return {"predicted_ttft_s": round(p.ttft_s, 4), "predicted_tpot_s": round(p.tpot_s, 5)}
