"""The plug-ins a policy is built of, as llm-d's scheduler declares them: filters (drop
backends, say why), weighted scorers (each adds its weighted term; the lowest total wins)
and a picker. Each plug-in takes a typed config (a frozen dataclass) and any policy may
reuse it: slo_aware is `SloFit` → `StallGuard` → AdapterAffinity (adapter_affinity.py),
then `TtftShare` + `StallShare` + `CostShare`, then `AmongLowest`.

A filter and a scorer see `Rows`: the backends still in the running, each with what the
latency model predicts there (core/latency.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.latency import Prediction
from gpuroute.router.core.policies.base import (
    PickContext,
    SettingError,
    check,
    min_with_random_ties,
)
from gpuroute.router.core.slo import SloClass
from gpuroute.router.core.slo_admission import TypeMargins

Rows = dict[Backend, Prediction]
Row = tuple[Backend, Prediction]
C = TypeVar("C")

# a hit loosens the margin only when the request needed at least this share of it
HIT_NEAR = 0.5


def config_of(kind: Callable[..., C], settings: object, **keys: str) -> C:
    """A plug-in's config from a policy's flat settings, each of its fields the setting
    `keys` names (`weight="cost_weight"`): the config checks its own ranges, and an error
    names the policy's setting, not the config's field."""
    try:
        return kind(**{field: getattr(settings, key) for field, key in keys.items()})
    except SettingError as exc:
        message = str(exc).removeprefix(f"{exc.key}: ")
        raise SettingError(keys[exc.key], message) from None


class Filter(Protocol):
    """Drops backends; when it keeps none, it names the one that misses least (`nearest`),
    which SLO-aware admission holds or refuses instead of sending."""

    name: ClassVar[str]

    def keep(self, ctx: PickContext, rows: Rows) -> tuple[Rows, Row | None]: ...


class Scorer(Protocol):
    """Each row's weighted term, in the rows' order (lower is better); `name` is the term's
    name in the decision log."""

    name: ClassVar[str]

    def terms(self, ctx: PickContext, rows: Rows) -> list[float]: ...


class Picker(Protocol):
    """One of `backends` by their total `scores` (lower is better)."""

    def pick(
        self, ctx: PickContext, backends: Sequence[Backend], scores: Sequence[float]
    ) -> Backend: ...


# -- pickers -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AmongLowestConfig:
    among: int = 1  # >1: uniformly among this many lowest (replicas sharing one view spread)

    def __post_init__(self) -> None:
        check(self.among >= 1, "among", "must be >= 1")


class AmongLowest:
    """The lowest score, exact ties broken at random; with `among` > 1, uniformly one of the
    `among` lowest: replicas deciding on the same (slightly stale) shared view spread over
    the best few instead of all landing on the single minimum."""

    def __init__(self, config: AmongLowestConfig = AmongLowestConfig()) -> None:
        self.among = config.among

    def pick(
        self, ctx: PickContext, backends: Sequence[Backend], scores: Sequence[float]
    ) -> Backend:
        if self.among > 1 and len(backends) > 1:
            ranked = sorted(range(len(backends)), key=scores.__getitem__)
            return backends[ranked[ctx.rng.randrange(min(self.among, len(ranked)))]]
        return min_with_random_ties(backends, scores, ctx.rng)


def total_scores(ctx: PickContext, scorers: Sequence[Scorer], rows: Rows) -> list[float]:
    """Each row's sum of the scorers' weighted terms (in the scorers' order), written into
    the trace term by term when there is one."""
    terms = [scorer.terms(ctx, rows) for scorer in scorers]
    if len(terms) == 3:  # the usual pipeline (slo_aware's), in one pass: the same floats as
        # the loop (x + y + z adds left to right), measured about twice as fast (~1 µs a pick)
        a, b, c = terms
        totals = [x + y + z for x, y, z in zip(a, b, c, strict=True)]
    else:  # left to right, as the terms are written
        totals = terms[0]
        for more in terms[1:]:
            totals = [total + term for total, term in zip(totals, more, strict=True)]
    if ctx.trace is not None:
        names = [scorer.name for scorer in scorers]
        for i, b in enumerate(rows):
            row = {name: round(t[i], 4) for name, t in zip(names, terms, strict=True)}
            ctx.trace.row(b)["score"] = row | {"total": round(totals[i], 4)}
    return totals


# -- filters -------------------------------------------------------------------------------
def waited(ctx: PickContext) -> float:
    """How long the request has waited (its TTFT budget shrank by it)."""
    arrived = ctx.request.arrived_at
    return ctx.now - arrived if arrived is not None else 0.0


@dataclass(frozen=True, slots=True)
class SloFitConfig:
    margin: float = 0.9  # a backend fits when predicted <= margin x the SLO (where it starts)

    def __post_init__(self) -> None:
        check(0 < self.margin <= 1, "margin", "must be in (0, 1]")


class SloFit:
    """Keeps the rows predicted within their GPU type's margin of the SLO: TTFT ≤ margin ×
    the class's TTFT (less what the request waited, and within `ctx.ttft_cap`) and TPOT ≤
    margin × its TPOT. Each type's margin starts at `margin` and follows the met-rate of
    what that type was sent (`observe`), so a biased or noisy prediction tightens itself
    and one kind of GPU's misses do not close the others."""

    name: ClassVar[str] = "slo_fit"

    def __init__(self, config: SloFitConfig = SloFitConfig()) -> None:
        self.margins = TypeMargins(config.margin, high=max(config.margin, 1.0))

    def keep(self, ctx: PickContext, rows: Rows) -> tuple[Rows, Row | None]:
        slo, now, trace, wait = ctx.slo, ctx.now, ctx.trace, waited(ctx)
        fits = {}
        margins: dict[str, float] = {}
        for b, p in rows.items():
            margin = margins.get(b.gpu_type)
            if margin is None:
                margin = margins[b.gpu_type] = self.margins.of(
                    margin_key(b.gpu_type, slo.name), now
                )
            ttft_bound = min(slo.ttft_s * margin - wait, ctx.ttft_cap * margin)
            tpot_bound = slo.tpot_s * margin
            if p.ttft_s <= ttft_bound and p.tpot_s <= tpot_bound:
                fits[b] = p
            if trace is not None:
                verdict = _filter_verdict(p, ttft_bound, tpot_bound)
                trace.row(b).update(margin=round(margin, 4), filter=verdict)
        if fits:
            return fits, None
        return fits, min(rows.items(), key=lambda row: share_of_slo(row[1], slo))

    def observe(self, needed: float | None, met: bool, gpu_type: str, now: float, slo: str) -> None:
        """A request of class `slo` placed on a `gpu_type` finished, meeting its SLO or not
        (`needed`: the margin it needed to be placed; None when sent as a predicted miss).
        Its margin is its GPU type's for that class: a loose class's hits must not loosen a
        tight class's predictions, nor its misses close a type to it. Only verdicts near
        the margin move it:
        - a miss it has already been tightened past (the request needed a looser margin
          than its type has now) tightens it no further. Verdicts arrive a request's
          duration after admission; in a burst the backlog admitted under the looser margin
          of before misses all at once, and counting those misses again drove the margin to
          its floor and refused what the tightened margin would serve in time;
        - a hit far inside it (needing less than HIT_NEAR of it) loosens nothing: a calm
          spell says nothing about requests near the bound, and its hits wound the margin
          up to its ceiling, so the next burst was admitted at predictions that missed."""
        key = margin_key(gpu_type, slo)
        if needed is not None:
            margin = self.margins.of(key, now)
            already_excluded = not met and needed > margin
            far_inside = met and needed < HIT_NEAR * margin
            if already_excluded or far_inside:
                return
        self.margins.observe(key, met, now)


class StallGuard:
    """While the latency model protects streams (their max_tokens is their output), keeps
    the rows whose prefill leaves every protected stream there within its TPOT (the model's
    stall allowance); when none does, the one that overruns it least."""

    name: ClassVar[str] = "stall_guard"

    def keep(self, ctx: PickContext, rows: Rows) -> tuple[Rows, Row | None]:
        latency = ctx.latency
        assert latency is not None
        if not latency.protected_streams:
            return rows, None
        allowance = latency.stall_allowance
        overrun = {b: p.interference_s - allowance(b.backend_id) for b, p in rows.items()}
        least = min(overrun, key=overrun.__getitem__)
        sparing = {b: p for b, p in rows.items() if overrun[b] <= 0}
        if ctx.trace is not None:
            for b in rows.keys() - sparing.keys():
                ctx.trace.row(b)["filter"] = (
                    f"dropped: its prefill would stall the streams there {overrun[b]:.3f} s "
                    "past their TPOT allowance"
                )
        return sparing, (None if sparing else (least, rows[least]))


# -- scorers -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WeightConfig:
    weight: float = 1.0  # what the scorer's term counts for in the total

    def __post_init__(self) -> None:
        check(self.weight >= 0, "weight", "must be >= 0")


class TtftShare:
    """The predicted TTFT as a share of the class's bound, stretched by the backend's
    warm-up as least outstanding work weighs it (slowness is in the prediction)."""

    name: ClassVar[str] = "ttft_share"

    def __init__(self, config: WeightConfig = WeightConfig()) -> None:
        self.weight = config.weight

    def terms(self, ctx: PickContext, rows: Rows) -> list[float]:
        bound, weight, warmup = ctx.slo.ttft_s, self.weight, ctx.warmup_factor
        return [weight * (p.ttft_s / (bound * warmup(b))) for b, p in rows.items()]


class StallShare:
    """The stall its prefill inflicts on the streams running there: each one's share of a
    TPOT budget its chunks take (what keeps long prompts off backends full of short
    answers)."""

    name: ClassVar[str] = "stall_share"

    def __init__(self, config: WeightConfig = WeightConfig()) -> None:
        self.weight = config.weight

    def terms(self, ctx: PickContext, rows: Rows) -> list[float]:
        # a stream's TPOT budget: what its tokens may take beyond the first
        budget = ctx.slo.tpot_s * max(ctx.expected_output - 1.0, 1.0)
        weight = self.weight
        return [weight * (b.in_flight * p.interference_s / budget) for b, p in rows.items()]


class CostShare:
    """Its cost in dollars there relative to the cheapest row (GPU-seconds × $/hour per GPU
    × GPUs; a type without a price counts 1.0)."""

    name: ClassVar[str] = "cost"

    def __init__(self, config: WeightConfig, prices: Mapping[str, float]) -> None:
        self.weight = config.weight
        self.prices = dict(prices)

    def terms(self, ctx: PickContext, rows: Rows) -> list[float]:
        cost_on, prices = ctx.cost_on, self.prices
        dollars = [cost_on(b) * prices.get(b.gpu, 1.0) * b.gpus for b in rows]
        cheapest = min(dollars) or 1e-12
        weight = self.weight / cheapest
        return [weight * d for d in dollars]


def margin_key(gpu_type: str, slo: str) -> str:
    """What a margin is kept by: a GPU type, for one SLO class."""
    return f"{gpu_type}|{slo}" if slo else gpu_type


def share_of_slo(prediction: Prediction, slo: SloClass) -> float:
    """The larger of predicted TTFT and TPOT as a fraction of the class's bound."""
    return max(prediction.ttft_s / slo.ttft_s, prediction.tpot_s / slo.tpot_s)


def _filter_verdict(p: Prediction, ttft_bound: float, tpot_bound: float) -> str:
    """Why the SLO filter kept or dropped a backend, in the decision log's words."""
    if p.ttft_s > ttft_bound:
        return f"dropped: predicted TTFT {p.ttft_s:.3f} s > bound {ttft_bound:.3f} s"
    if p.tpot_s > tpot_bound:
        return f"dropped: predicted TPOT {p.tpot_s:.4f} s > bound {tpot_bound:.4f} s"
    return "fits"


def run_filters(ctx: PickContext, filters: Iterable[Filter], rows: Rows) -> tuple[Rows, Row | None]:
    """The rows every filter kept, in order; when one keeps none, nothing and its nearest."""
    for stage in filters:
        rows, nearest = stage.keep(ctx, rows)
        if not rows:
            assert nearest is not None, f"{stage.name} kept nothing and named no nearest"
            return rows, nearest
    return rows, None
