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
- a session's remembered backend is taken while it is predicted to meet the SLO;
- when none is predicted to meet it: the least-violating backend, marked as a miss, which
  SLO-aware admission holds or refuses instead of sending."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.latency import Prediction
from gpuroute.router.core.policies.adapter_affinity import AdapterAffinity
from gpuroute.router.core.policies.base import (
    PickContext,
    PolicyBase,
    Shortlist,
    Verdict,
    min_with_random_ties,
)
from gpuroute.router.core.policies.prefix_affinity import PrefixIndex
from gpuroute.router.core.policies.sampling import CandidateSampler
from gpuroute.router.core.slo import SloClass
from gpuroute.router.core.slo_admission import TypeMargins

from gpuroute.gpus import GPU_SPECS
from gpuroute.prefix_blocks import BLOCK_TOKENS

# $/hour per GPU type: the data sheets' rough prices (gpuroute/gpus.py); they only rank types
# against each other: set your own in [slo] gpu_prices or a [[gpu_types]] price_per_hour
DEFAULT_GPU_PRICES: dict[str, float] = {
    name: spec.price_per_hour for name, spec in GPU_SPECS.items() if spec.price_per_hour
}

# a hit loosens the margin only when the request needed at least this share of it
HIT_NEAR = 0.5


class SloAware(PolicyBase):
    name: ClassVar[str] = "slo_aware"
    needs: ClassVar[frozenset[str]] = frozenset({"prefix_blocks"})
    predicts_slo: ClassVar[bool] = True
    traces_scores: ClassVar[bool] = True

    def __init__(
        self,
        *,
        full_scan_max: int = 24,
        per_type: int = 1,
        sample_per_type: int = 3,
        margin: float = 0.9,
        cost_weight: float = 0.1,
        prices: dict[str, float] | None = None,
        max_blocks: int = 1_000_000,
    ) -> None:
        if not 0 < margin <= 1 or cost_weight < 0:
            raise ValueError("margin must be in (0, 1] and cost_weight >= 0")
        self.sampler = CandidateSampler(full_scan_max, sample_per_type, per_type_keep=per_type)
        # each GPU type's margin adapts to keep what it is sent meeting the SLO
        # (slo_admission.py)
        self.margins = TypeMargins(margin, high=max(margin, 1.0))
        self.cost_weight = cost_weight
        self.prices = {**DEFAULT_GPU_PRICES, **(prices or {})}
        self.index = PrefixIndex(max_blocks)
        self.adapters = AdapterAffinity()

    # -- sample ----------------------------------------------------------------------------
    @staticmethod
    def load(ctx: PickContext, b: Backend) -> float:
        """In flight per capacity, counting other routers' requests there (the agent's
        report or the peers' shared ledger, in seconds of work) at this request's cost,
        stretched like least outstanding work by how much slower than expected it runs."""
        others = b.others_work
        if others > 0:
            others /= max(ctx.cost_on(b), 1e-6)
        return (b.in_flight + 1 + others) * b.slowness / ctx.capacity_of(b)

    def considered(
        self, ctx: PickContext, candidates: Sequence[Backend], matched: dict[str, int]
    ) -> Sequence[Backend]:
        """All of a small pool; of a large one, the least loaded few of a sample of each
        GPU type, and every prefix holder."""
        sampled = self.sampler.sample(ctx, candidates, functools.partial(self.load, ctx))
        if sampled is candidates or not (matched or ctx.request.adapter):
            return sampled
        _, by_id = self.sampler.by_type(candidates)
        holders = [by_id[i] for i in matched if i in by_id]
        holders += self.adapters.home(ctx, candidates)  # its adapter's home set
        return [*sampled, *(b for b in dict.fromkeys(holders) if b not in sampled)]

    # -- predict and filter ----------------------------------------------------------------
    def predictions(
        self, ctx: PickContext, considered: Sequence[Backend], matched: dict[str, int]
    ) -> list[tuple[Backend, Prediction]]:
        """Each backend with its predicted TTFT and TPOT; a prefix hit there takes the
        cached blocks off the prompt to prefill."""
        request, latency, trace = ctx.request, ctx.latency, ctx.trace
        assert latency is not None  # the scheduler builds one for policies that predict
        prompt, output = request.prompt_tokens, ctx.expected_output
        rows = []
        for b in considered:
            depth = matched.get(b.backend_id, 0)
            uncached = max(1, prompt - depth * BLOCK_TOKENS) if depth else prompt
            rows.append((b, latency.predict(b, uncached, prompt, output, ctx.now)))
            if trace is not None:
                trace.row(b).update(cached_blocks=depth, **_predicted(rows[-1][1]))
        return rows

    def shortlist(self, ctx: PickContext, candidates: Sequence[Backend]) -> Shortlist:
        """The backends predicted to meet the request's SLO (and to spare the streams
        running there); nothing kept and the least-violating one as `miss` when none is."""
        slo = ctx.slo
        blocks = ctx.request.prefix_blocks
        matched = self.index.matches(blocks) if blocks else {}
        rows = self.predictions(ctx, self.considered(ctx, candidates, matched), matched)
        arrived = ctx.request.arrived_at
        waited = ctx.now - arrived if arrived is not None else 0.0
        fits = self._fitting(ctx, rows, waited)
        if not fits:
            backend, prediction = min(rows, key=lambda row: share_of_slo(row[1], slo))
            return Shortlist((), miss=Verdict(backend, prediction, fits=False), waited=waited)
        assert ctx.latency is not None
        if ctx.latency.protected_streams:
            fits, spared = self._sparing_streams(ctx, fits)
            if not fits:  # wherever its prefill goes, a protected stream misses its TPOT
                return Shortlist((), miss=Verdict(*spared, fits=False), waited=waited)
        fits = self.adapters.narrow(ctx, fits)  # its LoRA adapter's home set, SLO first
        ctx.shortlist = shortlist = Shortlist(list(fits), fits, waited=waited)
        return shortlist

    def _fitting(
        self, ctx: PickContext, rows: list[tuple[Backend, Prediction]], waited: float
    ) -> dict[Backend, Prediction]:
        """The rows predicted within their GPU type's margin of the SLO (the TTFT less what
        the request already waited)."""
        slo, now, trace = ctx.slo, ctx.now, ctx.trace
        fits = {}
        margins: dict[str, float] = {}
        for b, p in rows:
            margin = margins.get(b.gpu_type)
            if margin is None:
                key = margin_key(b.gpu_type, slo.name)
                margin = margins[b.gpu_type] = self.margins.of(key, now)
            ttft_bound = min(slo.ttft_s * margin - waited, ctx.ttft_cap * margin)
            tpot_bound = slo.tpot_s * margin
            if p.ttft_s <= ttft_bound and p.tpot_s <= tpot_bound:
                fits[b] = p
            if trace is not None:
                verdict = _filter_verdict(p, ttft_bound, tpot_bound)
                trace.row(b).update(margin=round(margin, 4), filter=verdict)
        return fits

    def _sparing_streams(
        self, ctx: PickContext, fits: dict[Backend, Prediction]
    ) -> tuple[dict[Backend, Prediction], tuple[Backend, Prediction]]:
        """The fits whose prefill leaves every protected stream there within its TPOT
        (latency model's stall allowance), and the one that overruns it least."""
        assert ctx.latency is not None
        allowance = ctx.latency.stall_allowance
        overrun = {b: p.interference_s - allowance(b.backend_id) for b, p in fits.items()}
        least = min(overrun, key=overrun.__getitem__)
        sparing = {b: p for b, p in fits.items() if overrun[b] <= 0}
        if ctx.trace is not None:
            for b in fits.keys() - sparing.keys():
                ctx.trace.row(b)["filter"] = (
                    f"dropped: its prefill would stall the streams there {overrun[b]:.3f} s "
                    "past their TPOT allowance"
                )
        return sparing, (least, fits[least])

    # -- score and pick --------------------------------------------------------------------
    def _scores(self, ctx: PickContext, fits: dict[Backend, Prediction]) -> list[float]:
        """Predicted TTFT share + the stall share it inflicts on running streams + cost."""
        slo = ctx.slo
        # a stream's TPOT budget: what its tokens may take beyond the first
        budget = slo.tpot_s * max(ctx.expected_output - 1.0, 1.0)
        cost_on, prices = ctx.cost_on, self.prices
        dollars = [cost_on(b) * prices.get(b.gpu, 1.0) * b.gpus for b in fits]
        cheapest = min(dollars) or 1e-12
        cost_weight, ttft_bound = self.cost_weight / cheapest, slo.ttft_s
        terms = [
            (
                p.ttft_s / (ttft_bound * ctx.warmup_factor(b)),  # slowness is in the prediction
                b.in_flight * p.interference_s / budget,
                cost_weight * d,
            )
            for (b, p), d in zip(fits.items(), dollars, strict=True)
        ]
        scores = [ttft + stall + cost for ttft, stall, cost in terms]
        if ctx.trace is not None:
            for b, (ttft, stall, cost), score in zip(fits, terms, scores, strict=True):
                ctx.trace.row(b)["score"] = _rounded(
                    ttft_share=ttft, stall_share=stall, cost=cost, total=score
                )
        return scores

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        """The lowest score among the shortlist's fits (its shortlist made now when the
        scheduler did not run that stage first)."""
        shortlist = ctx.shortlist
        if shortlist is None:
            shortlist = self.shortlist(ctx, candidates)
            if shortlist.miss is not None:
                return shortlist.miss.backend
        assert shortlist.predictions is not None
        scores = self._scores(ctx, shortlist.predictions)
        return min_with_random_ties(shortlist.kept, scores, ctx.rng)

    def placed(self, ctx: PickContext, backend: Backend, *, preferred: bool) -> Verdict:
        """It goes there: the margin it needed is kept for its verdict, and the prefix
        index learns that the backend now holds its blocks."""
        shortlist = ctx.shortlist
        assert shortlist is not None and shortlist.predictions is not None
        prediction = shortlist.predictions[backend]
        needed = needed_margin(prediction, ctx.slo, shortlist.waited)
        blocks = ctx.request.prefix_blocks
        if blocks:
            self.index.record(blocks, backend.backend_id)
        if ctx.trace is not None:
            ctx.trace.margin = round(needed, 4)
        return Verdict(backend, prediction, fits=True, preferred=preferred, needed=needed)

    def observe_slo(
        self, needed: float | None, met: bool, backend: Backend, now: float, slo: str = ""
    ) -> None:
        """A request of class `slo` this policy placed on `backend` finished (its margin is
        its GPU type's for that class: a loose class's hits must not loosen a tight
        class's predictions, nor its misses close a type to it), meeting its SLO or not
        (`needed`: the margin it needed to be placed, which its lifetime kept; None when it
        was sent as a predicted miss). Only verdicts near the margin move it:
        - a miss it has already been tightened past (the request needed a looser margin
          than its type has now) tightens it no further. Verdicts arrive a request's
          duration after admission; in a burst the backlog admitted under the looser margin
          of before misses all at once, and counting those misses again drove the margin to
          its floor and refused what the tightened margin would serve in time;
        - a hit far inside it (needing less than HIT_NEAR of it) loosens nothing: a calm
          spell says nothing about requests near the bound, and its hits wound the margin
          up to its ceiling, so the next burst was admitted at predictions that missed."""
        key = margin_key(backend.gpu_type, slo)
        if needed is not None:
            margin = self.margins.of(key, now)
            already_excluded = not met and needed > margin
            far_inside = met and needed < HIT_NEAR * margin
            if already_excluded or far_inside:
                return
        self.margins.observe(key, met, now)

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        """The larger predicted fraction of its SLO there (what the filter compares), with
        the prefix cache's hit there taken off the prompt as the filter takes it."""
        blocks = ctx.request.prefix_blocks
        matched = self.index.matches(blocks) if blocks else {}
        ((_, p),) = self.predictions(ctx, [backend], matched)
        return share_of_slo(p, ctx.slo)


def margin_key(gpu_type: str, slo: str) -> str:
    """What a margin is kept by: a GPU type, for one SLO class."""
    return f"{gpu_type}|{slo}" if slo else gpu_type


def needed_margin(p: Prediction, slo: SloClass, waited: float) -> float:
    """The tightest margin that still admits this prediction (for its verdict)."""
    return max((p.ttft_s + waited) / slo.ttft_s, p.tpot_s / slo.tpot_s)


def share_of_slo(prediction: Prediction, slo: SloClass) -> float:
    """The larger of predicted TTFT and TPOT as a fraction of the class's bound."""
    return max(prediction.ttft_s / slo.ttft_s, prediction.tpot_s / slo.tpot_s)


def _predicted(p: Prediction) -> dict[str, float]:
    return {"predicted_ttft_s": round(p.ttft_s, 4), "predicted_tpot_s": round(p.tpot_s, 5)}


def _filter_verdict(p: Prediction, ttft_bound: float, tpot_bound: float) -> str:
    """Why the SLO filter kept or dropped a backend, in the decision log's words."""
    if p.ttft_s > ttft_bound:
        return f"dropped: predicted TTFT {p.ttft_s:.3f} s > bound {ttft_bound:.3f} s"
    if p.tpot_s > tpot_bound:
        return f"dropped: predicted TPOT {p.tpot_s:.4f} s > bound {tpot_bound:.4f} s"
    return "fits"


def _rounded(**terms: float) -> dict[str, float]:
    return {name: round(value, 4) for name, value in terms.items()}
