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
import heapq
from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.latency import Prediction
from gpuroute.router.core.policies.base import PickContext, Verdict, min_with_random_ties
from gpuroute.router.core.policies.prefix_affinity import PrefixIndex
from gpuroute.router.core.slo import SloClass
from gpuroute.router.core.slo_admission import TypeMargins

from gpuroute.prefix_blocks import BLOCK_TOKENS

# Rough on-demand $/hour for one GPU (public cloud list prices, 2024-2025, GPU share of the
# instance); they only rank GPU types against each other: set your own in [slo] gpu_prices.
DEFAULT_GPU_PRICES: dict[str, float] = {
    "H100": 4.0,
    "A100": 2.5,
    "V100": 1.5,
    "L4": 0.7,
    "T4": 0.35,
}

# a hit loosens the margin only when the request needed at least this share of it
HIT_NEAR = 0.5

# the routable list it was made from, its backends by GPU type, and by id
_Grouping = tuple[Sequence[Backend] | None, list[list[Backend]], dict[str, Backend]]


class SloAware:
    name: ClassVar[str] = "slo_aware"
    needs: ClassVar[frozenset[str]] = frozenset({"prefix_blocks"})
    honours_preference: ClassVar[bool] = True

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
        if full_scan_max < 1 or per_type < 1 or sample_per_type < per_type:
            raise ValueError("full_scan_max, per_type >= 1 and sample_per_type >= per_type")
        if not 0 < margin <= 1 or cost_weight < 0:
            raise ValueError("margin must be in (0, 1] and cost_weight >= 0")
        self.full_scan_max = full_scan_max
        self.per_type = per_type
        self.sample_per_type = sample_per_type
        # each GPU type's margin adapts to keep what it is sent meeting the SLO
        # (slo_admission.py)
        self.margins = TypeMargins(margin, high=max(margin, 1.0))
        self.cost_weight = cost_weight
        self.prices = {**DEFAULT_GPU_PRICES, **(prices or {})}
        self.index = PrefixIndex(max_blocks)
        self._groups: _Grouping = (None, [], {})

    # -- candidates ------------------------------------------------------------------------
    @staticmethod
    def load(ctx: PickContext, b: Backend) -> float:
        """In flight per capacity, counting other routers' requests there (the agent's
        report or the peers' shared ledger, in seconds of work) at this request's cost,
        stretched like least outstanding work by how much slower than expected it runs."""
        others = b.external if b.external > b.shared else b.shared
        if others > 0:
            others /= max(ctx.cost_on(b), 1e-6)
        return (b.in_flight + 1 + others) * b.slowness / ctx.capacity_of(b)

    def considered(
        self, ctx: PickContext, candidates: Sequence[Backend], matched: dict[str, int]
    ) -> Sequence[Backend]:
        """All of a small pool; of a large one, the least loaded few of a sample of each
        GPU type, and every prefix holder."""
        if len(candidates) <= self.full_scan_max:
            return candidates
        groups, by_id = self._by_type(candidates)
        chosen: list[Backend] = []
        draw, k, keep = ctx.rng.random, self.sample_per_type, self.per_type
        load = functools.partial(self.load, ctx)
        for group in groups:
            n = len(group)
            # with replacement: k cheap draws, not random.sample's bookkeeping
            drawn = [group[int(draw() * n)] for _ in range(k)] if n > k else group
            if keep == 1:
                chosen.append(min(drawn, key=load))
            else:
                chosen.extend(heapq.nsmallest(keep, dict.fromkeys(drawn), key=load))
        if matched:
            holders = [by_id[i] for i in matched if i in by_id]
            chosen.extend(b for b in dict.fromkeys(holders) if b not in chosen)
        return chosen

    def _by_type(
        self, candidates: Sequence[Backend]
    ) -> tuple[list[list[Backend]], dict[str, Backend]]:
        """The candidates grouped by GPU type, and by id. The routable list is cached by
        BackendSet until the fleet changes, so its grouping is kept while the very same list
        object comes back (held here, so its identity cannot pass to another list)."""
        held, groups, by_id = self._groups
        if candidates is not held:
            by_type: dict[str, list[Backend]] = {}
            for b in candidates:
                by_type.setdefault(b.gpu_type, []).append(b)
            groups, by_id = list(by_type.values()), {b.backend_id: b for b in candidates}
            self._groups = (candidates, groups, by_id)
        return groups, by_id

    # -- prediction and score --------------------------------------------------------------
    def predictions(
        self, ctx: PickContext, considered: Sequence[Backend], matched: dict[str, int]
    ) -> list[tuple[Backend, Prediction]]:
        """Each backend with its predicted TTFT and TPOT; a prefix hit there takes the
        cached blocks off the prompt to prefill."""
        request, latency = ctx.request, ctx.latency
        assert latency is not None  # the scheduler builds one for policies that predict
        prompt, output = request.prompt_tokens, ctx.expected_output
        rows = []
        for b in considered:
            depth = matched.get(b.backend_id, 0)
            uncached = max(1, prompt - depth * BLOCK_TOKENS) if depth else prompt
            rows.append((b, latency.predict(b, uncached, prompt, output, ctx.now)))
        return rows

    @staticmethod
    def _sparing_streams(
        ctx: PickContext, fits: dict[Backend, Prediction]
    ) -> tuple[dict[Backend, Prediction], tuple[Backend, Prediction]]:
        """The fits whose prefill leaves every protected stream there within its TPOT
        (latency model's stall allowance), and the one that overruns it least."""
        assert ctx.latency is not None
        allowance = ctx.latency.stall_allowance
        overrun = {b: p.interference_s - allowance(b.backend_id) for b, p in fits.items()}
        least = min(overrun, key=overrun.__getitem__)
        sparing = {b: p for b, p in fits.items() if overrun[b] <= 0}
        return sparing, (least, fits[least])

    def _scores(self, ctx: PickContext, fits: dict[Backend, Prediction]) -> list[float]:
        """Predicted TTFT share + the stall share it inflicts on running streams + cost."""
        slo = ctx.slo
        # a stream's TPOT budget: what its tokens may take beyond the first
        budget = slo.tpot_s * max(ctx.expected_output - 1.0, 1.0)
        cost_on, prices = ctx.cost_on, self.prices
        dollars = [cost_on(b) * prices.get(b.gpu_type, 1.0) for b in fits]
        cheapest = min(dollars) or 1e-12
        cost_weight, ttft_bound = self.cost_weight / cheapest, slo.ttft_s
        return [
            p.ttft_s / (ttft_bound * ctx.warmup_factor(b))  # slowness is in the prediction
            + b.in_flight * p.interference_s / budget
            + cost_weight * d
            for (b, p), d in zip(fits.items(), dollars, strict=True)
        ]

    def choose(self, ctx: PickContext, candidates: Sequence[Backend]) -> Verdict:
        slo = ctx.slo
        blocks = ctx.request.prefix_blocks
        matched = self.index.matches(blocks) if blocks else {}
        rows = self.predictions(ctx, self.considered(ctx, candidates, matched), matched)
        arrived = ctx.request.arrived_at
        waited = ctx.now - arrived if arrived is not None else 0.0
        fits = self._fitting(rows, slo, waited, ctx.now)
        if not fits:
            backend, prediction = min(rows, key=lambda row: share_of_slo(row[1], slo))
            return Verdict(backend, prediction, fits=False)
        if ctx.latency.protected_streams:
            fits, spared = self._sparing_streams(ctx, fits)
            if not fits:  # wherever its prefill goes, a protected stream misses its TPOT
                return Verdict(*spared, fits=False)
        preferred = next((b for b in fits if b.backend_id == ctx.preferred), None)
        if preferred is None:
            scores = self._scores(ctx, fits)
            preferred = best = min_with_random_ties(list(fits), scores, ctx.rng)
        else:
            best = None
        needed = needed_margin(fits[preferred], slo, waited)
        return self._chosen(preferred, fits[preferred], blocks, needed, preferred=best is None)

    def _fitting(
        self, rows: list[tuple[Backend, Prediction]], slo: SloClass, waited: float, now: float
    ) -> dict[Backend, Prediction]:
        """The rows predicted within their GPU type's margin of the SLO (the TTFT less what
        the request already waited)."""
        fits = {}
        margins: dict[str, float] = {}
        for b, p in rows:
            margin = margins.get(b.gpu_type)
            if margin is None:
                margin = margins[b.gpu_type] = self.margins.of(b.gpu_type, now)
            if p.ttft_s <= slo.ttft_s * margin - waited and p.tpot_s <= slo.tpot_s * margin:
                fits[b] = p
        return fits

    def _chosen(
        self,
        backend: Backend,
        prediction: Prediction,
        blocks: Sequence[int],
        needed: float,
        *,
        preferred: bool = False,
    ) -> Verdict:
        """It goes there: the prefix index learns that the backend now holds its blocks."""
        if blocks:
            self.index.record(blocks, backend.backend_id)
        return Verdict(backend, prediction, fits=True, preferred=preferred, needed=needed)

    def observe_slo(self, needed: float | None, met: bool, backend: Backend, now: float) -> None:
        """A request this policy placed on `backend` finished, meeting its SLO or not
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
        if needed is not None:
            margin = self.margins.of(backend.gpu_type, now)
            already_excluded = not met and needed > margin
            far_inside = met and needed < HIT_NEAR * margin
            if already_excluded or far_inside:
                return
        self.margins.observe(backend.gpu_type, met, now)

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        return self.choose(ctx, candidates).backend

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        """The larger predicted fraction of its SLO there (what the filter compares)."""
        ((_, p),) = self.predictions(ctx, [backend], {})
        return share_of_slo(p, ctx.slo)


def needed_margin(p: Prediction, slo: SloClass, waited: float) -> float:
    """The tightest margin that still admits this prediction (for its verdict)."""
    return max((p.ttft_s + waited) / slo.ttft_s, p.tpot_s / slo.tpot_s)


def share_of_slo(prediction: Prediction, slo: SloClass) -> float:
    """The larger of predicted TTFT and TPOT as a fraction of the class's bound."""
    return max(prediction.ttft_s / slo.ttft_s, prediction.tpot_s / slo.tpot_s)
