"""SLO-aware placement (the default): filter the backends predicted to meet the request's
SLO, then pick among them by a score of slack and cost.

Pipeline, as llm-d's filter → scorer → picker:
- candidates: all of a small pool; of a large one, the `per_type` least-loaded of a random
  sample of each GPU type, plus every prefix holder (so a sampled pool still sees each kind
  of GPU and the caches);
- prediction (core/latency.py): TTFT and TPOT on each, with the prefix cache's expected hit
  taken off the prompt (a prefix hit shortens predicted TTFT; that is the prefix scorer);
- filter: predicted TTFT ≤ margin × the class's TTFT (less what it waited) and TPOT ≤
  margin × its TPOT, where the margin starts at `margin` and follows the met-rate of what
  was admitted (MarginController), so a biased or noisy prediction tightens itself;
- score (lower wins): `slack_weight` × the larger of the two predicted fractions of the SLO
  + `cost_weight` × the request's cost in dollars there relative to the cheapest candidate;
  the default weights keep the fleet balanced in slack and let a cheap GPU take what it can
  serve within the SLO when the slack is comparable;
- a session's remembered backend is taken while it is predicted to meet the SLO;
- when none is predicted to meet it: the least-violating backend, marked as a miss, which
  SLO-aware admission holds or refuses instead of sending."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.latency import Prediction
from gpuroute.router.core.policies.base import PickContext, Verdict
from gpuroute.router.core.policies.prefix_affinity import PrefixIndex
from gpuroute.router.core.slo_admission import MarginController

from gpuroute.prefix_blocks import BLOCK_TOKENS

# Rough on-demand $/hour for one GPU (public cloud list prices, 2024-2025, GPU share of the
# instance); they only rank GPU types against each other: set your own under [scheduler].
DEFAULT_GPU_PRICES: dict[str, float] = {
    "H100": 4.0,
    "A100": 2.5,
    "V100": 1.5,
    "L4": 0.7,
    "T4": 0.35,
}


class SloAware:
    name: ClassVar[str] = "slo_aware"
    needs: ClassVar[frozenset[str]] = frozenset({"prefix_blocks"})
    honours_preference: ClassVar[bool] = True

    def __init__(
        self,
        *,
        full_scan_max: int = 24,
        per_type: int = 2,
        sample_per_type: int = 4,
        margin: float = 0.9,
        slack_weight: float = 1.0,
        cost_weight: float = 0.1,
        prices: dict[str, float] | None = None,
        max_blocks: int = 1_000_000,
        balance: str = "connections",
    ) -> None:
        self.balance = balance
        if full_scan_max < 1 or per_type < 1 or sample_per_type < per_type:
            raise ValueError("full_scan_max, per_type >= 1 and sample_per_type >= per_type")
        if not 0 < margin <= 1 or slack_weight < 0 or cost_weight < 0:
            raise ValueError("margin must be in (0, 1], weights >= 0")
        self.full_scan_max = full_scan_max
        self.per_type = per_type
        self.sample_per_type = sample_per_type
        # the margin adapts to keep admitted requests meeting their SLO (slo_admission.py)
        self.control = MarginController(margin, high=max(margin, 1.0))
        self.slack_weight = slack_weight
        self.cost_weight = cost_weight
        self.prices = {**DEFAULT_GPU_PRICES, **(prices or {})}
        self.index = PrefixIndex(max_blocks)
        self._groups: tuple[int, int, dict[str, list[Backend]]] | None = None

    # -- candidates ------------------------------------------------------------------------
    def _by_type(self, ctx: PickContext, candidates: Sequence[Backend]) -> dict[str, list[Backend]]:
        key = (ctx.backends.version, id(candidates))
        if self._groups is None or self._groups[:2] != key:
            groups: dict[str, list[Backend]] = {}
            for b in candidates:
                groups.setdefault(b.gpu_type, []).append(b)
            self._groups = (*key, groups)
        return self._groups[2]

    def considered(
        self, ctx: PickContext, candidates: Sequence[Backend], matched: dict[str, int]
    ) -> Sequence[Backend]:
        if len(candidates) <= self.full_scan_max:
            return candidates
        chosen: list[Backend] = []
        for group in self._by_type(ctx, candidates).values():
            if len(group) > self.sample_per_type:
                group = ctx.rng.sample(group, self.sample_per_type)
            group = sorted(group, key=lambda b: b.in_flight / b.capacity)
            chosen.extend(group[: self.per_type])
        if matched:
            seen = {b.backend_id for b in chosen}
            chosen.extend(
                b for b in candidates if b.backend_id in matched and b.backend_id not in seen
            )
        return chosen

    # -- prediction and score --------------------------------------------------------------
    def predictions(
        self, ctx: PickContext, considered: Sequence[Backend], matched: dict[str, int]
    ) -> list[tuple[Backend, Prediction, int]]:
        request, latency = ctx.request, ctx.latency
        assert latency is not None  # the scheduler builds one for policies that predict
        prompt, output = request.prompt_tokens, ctx.expected_output
        out = []
        for b in considered:
            depth = matched.get(b.backend_id, 0) if matched else 0
            uncached = max(1, prompt - depth * BLOCK_TOKENS) if depth else prompt
            pred = latency.predict(
                b.backend_id,
                b.gpu_type,
                b.in_flight,
                uncached,
                prompt,
                output,
                ctx.now,
                max(b.external, b.shared),
            )
            out.append((b, pred, uncached))
        return out

    def _dollars(self, ctx: PickContext, backend: Backend) -> float:
        return ctx.cost_on(backend) * self.prices.get(backend.gpu_type, 1.0)

    def choose(self, ctx: PickContext, candidates: Sequence[Backend]) -> Verdict:
        slo = ctx.slo
        blocks = ctx.request.prefix_blocks
        matched = self.index.matches(blocks) if blocks else {}
        rows = self.predictions(ctx, self.considered(ctx, candidates, matched), matched)
        arrived = ctx.request.arrived_at
        waited = ctx.now - arrived if arrived is not None else 0.0
        margin = self.control.margin
        ttft_cap, tpot_cap = slo.ttft_s * margin - waited, slo.tpot_s * margin
        fits = [r for r in rows if r[1].ttft_s <= ttft_cap and r[1].tpot_s <= tpot_cap]
        if ctx.preferred is not None:
            for row in fits:
                if row[0].backend_id == ctx.preferred:
                    return self._verdict(row, True, blocks, preferred=True)
        if not fits:
            worst = [max(p.ttft_s / slo.ttft_s, p.tpot_s / slo.tpot_s) for _, p, _ in rows]
            return self._verdict(rows[worst.index(min(worst))], False, blocks)
        cheapest = min(self._dollars(ctx, b) for b, _, _ in fits) or 1e-12
        best, best_score = fits[0], float("inf")
        for row in fits:
            b, p, _ = row
            if self.balance == "connections":
                pressure = self._connections(ctx, b)
            elif self.balance == "work":
                pressure = ctx.work_score(b)
            else:
                pressure = max(p.ttft_s / max(ttft_cap, 1e-9), p.tpot_s / tpot_cap)
            score = self.slack_weight * pressure + self.cost_weight * (
                self._dollars(ctx, b) / cheapest
            )
            if score < best_score or (score == best_score and ctx.rng.random() < 0.5):
                best, best_score = row, score
        return self._verdict(best, True, blocks)

    def _verdict(
        self,
        row: tuple[Backend, Prediction, int],
        fits: bool,
        blocks: Sequence[int],
        *,
        preferred: bool = False,
    ) -> Verdict:
        backend, prediction, uncached = row
        if blocks and fits:
            self.index.record(blocks, backend.backend_id)
        return Verdict(backend, prediction, uncached, fits, preferred)

    @staticmethod
    def _connections(ctx: PickContext, b: Backend) -> float:
        """In flight per capacity, counting other routers' requests there (the agent's
        report or the peers' shared ledger, in seconds of work) at this request's cost."""
        others = max(b.external, b.shared)
        if others > 0:
            others /= max(ctx.cost_on(b), 1e-6)
        # stretched like least outstanding work by how much slower than expected it runs
        return (b.in_flight + 1 + others) * b.slowness / ctx.capacity_of(b)

    def observe_slo(self, met: bool) -> None:
        """A request this policy placed finished, meeting its SLO or not."""
        self.control.observe(met)

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        return self.choose(ctx, candidates).backend

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        ((_, p, _),) = self.predictions(ctx, [backend], {})
        return max(p.ttft_s / ctx.slo.ttft_s, p.tpot_s / ctx.slo.tpot_s)
