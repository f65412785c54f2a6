"""What the latency model learns per GPU type beyond its roofline prior (sans-IO): the ratio
of observed to predicted TTFT and TPOT, and the fixed part of TTFT outside the GPU.

Evidence only comes from requests the router sends, and an SLO-aware router does not send
what it predicts to miss. So a correction that makes a GPU type look slower than its prior
can starve itself: learned in an overload (an engine's own queue read as slowness), it
keeps every request away, no request teaches it otherwise, and the type stays closed with
its GPUs idle. So while requests are being turned away on predictions, the pessimistic
corrections of a type with nothing in flight and no fresh evidence for `grace_s` return
towards the prior over `memory_s`, and the type is tried again. A fleet idle for want of
traffic forgets nothing; a type with requests in flight keeps its lessons, their verdicts
are coming (a backend slowed mid-run holds its streams long, and forgetting its type's
lesson sent it more). Corrections that make a type look faster do not starve (what they
admit teaches them back) and do not age."""

from __future__ import annotations

import math
from collections.abc import Collection

RATIO_MIN, RATIO_MAX = 0.125, 8.0
TPOT_RATIO_MIN, TPOT_RATIO_MAX = 0.5, 2.0  # TPOT is the noisier one: short answers see
# one long prefill chunk or none, so a tighter band keeps that noise from steering placement
LOG_STEP_MAX = math.log(2.0)
# the fixed part of every TTFT (HTTP hops, tokenisation, the first chunk's flush): the
# intercept of an exponentially weighted regression of measured on predicted TTFT per GPU
# type, over about 1/OVERHEAD_WEIGHT first tokens
OVERHEAD_WEIGHT = 0.02
OVERHEAD_MAX_S = 1.0


class InterceptFit:
    """Exponentially weighted least squares of measured (y) on predicted (x) TTFT; its
    intercept is the fixed part the GPU model does not explain. It needs spread in x,
    which varied prompt lengths give; until then it has no answer (None)."""

    __slots__ = ("mx", "my", "sxx", "sxy", "weight")

    def __init__(self) -> None:
        self.mx = self.my = self.sxx = self.sxy = self.weight = 0.0

    def add(self, x: float, y: float) -> None:
        w = OVERHEAD_WEIGHT
        self.weight += w * (1.0 - self.weight)
        dx, dy = x - self.mx, y - self.my
        self.mx += w * dx
        self.my += w * dy
        self.sxx = (1 - w) * (self.sxx + w * dx * dx)
        self.sxy = (1 - w) * (self.sxy + w * dx * dy)

    def intercept(self) -> float | None:
        if self.weight < 0.5 or self.sxx <= (0.1 * self.mx) ** 2:
            return None  # too few points, or too little spread to tell slope from intercept
        slope = self.sxy / self.sxx
        return min(max(self.my - slope * self.mx, 0.0), OVERHEAD_MAX_S)


class Corrections:
    """Per GPU type: `ttft_ratio`, `tpot_ratio` (observed ÷ predicted) and `overhead_s`."""

    def __init__(self, alpha: float, *, grace_s: float = 5.0, memory_s: float = 10.0) -> None:
        if not 0 < alpha <= 1 or grace_s < 0 or memory_s <= 0:
            raise ValueError("need alpha in (0, 1], grace_s >= 0, memory_s > 0")
        self.alpha, self.grace_s, self.memory_s = alpha, grace_s, memory_s
        self.ttft_ratio: dict[str, float] = {}
        self.tpot_ratio: dict[str, float] = {}
        self.overhead_s: dict[str, float] = {}  # fixed TTFT outside the GPU
        self._fits: dict[str, InterceptFit] = {}
        self._evidence_at: dict[str, float] = {}  # the last verdict learned from
        self._aged_to: dict[str, float] = {}  # how far ageing has been applied

    def learn_ttft(
        self, gpu_type: str, predicted_gpu_s: float, measured_s: float, alone: bool, now: float
    ) -> None:
        """The fixed overhead (the regression's intercept, fitted on requests that had no
        queue ahead, where TTFT is prefill plus overhead and nothing else) and the ratio of
        what remains. Kept apart, the overhead does not leak into the ratios, where it
        would make the GPUs with the shortest prefills (the fastest) look the slowest."""
        self._evidence_at[gpu_type] = now
        if alone:
            fit = self._fits.get(gpu_type)
            if fit is None:
                fit = self._fits[gpu_type] = InterceptFit()
            fit.add(predicted_gpu_s, measured_s)
            intercept = fit.intercept()
            if intercept is not None:
                self.overhead_s[gpu_type] = intercept
            else:  # not yet fitted: none (or what ageing left of an earlier fit)
                self.overhead_s.setdefault(gpu_type, 0.0)
        overhead = self.overhead_s.get(gpu_type, 0.0)
        gpu_part = max(measured_s - overhead, predicted_gpu_s / 8)
        self._step(self.ttft_ratio, gpu_type, gpu_part / predicted_gpu_s, (RATIO_MIN, RATIO_MAX))

    def learn_tpot(self, gpu_type: str, sample: float, now: float | None) -> None:
        if now is not None:
            self._evidence_at[gpu_type] = now
        self._step(self.tpot_ratio, gpu_type, sample, (TPOT_RATIO_MIN, TPOT_RATIO_MAX))

    def _step(
        self, ratios: dict[str, float], gpu_type: str, sample: float, bounds: tuple[float, float]
    ) -> None:
        # The prediction already carried the old ratio, so the sample corrects it
        # multiplicatively; in log space, each step bounded to a factor of 2, so one outlier
        # (a request stuck behind a KV-cache stall) moves it no more than a typical miss does
        # and errors either way pull equally hard.
        step = min(max(math.log(max(sample, 1e-9)), -LOG_STEP_MAX), LOG_STEP_MAX)
        new = ratios.get(gpu_type, 1.0) * math.exp(self.alpha * step)
        ratios[gpu_type] = min(max(new, bounds[0]), bounds[1])

    def age(self, now: float, busy: Collection[str] = (), *, turned_away: bool = True) -> None:
        """Pessimistic corrections of the GPU types with nothing in flight (`busy` names
        those with requests in flight: their verdicts are on the way) and no evidence for
        `grace_s` move towards the prior: ratios above 1 towards 1 (geometrically), the
        overhead towards 0. The overhead's fit restarts: its points came from the spell
        that is over. Only while requests predicted to miss are `turned_away`: a fleet idle
        for want of traffic keeps what it learned."""
        for gpu_type, seen in self._evidence_at.items():
            if gpu_type in busy or not turned_away:
                self._aged_to[gpu_type] = now  # idle, turned-away time alone counts
                continue
            since = max(seen + self.grace_s, self._aged_to.get(gpu_type, -math.inf))
            if now <= since:
                continue
            # no points can have come since the grace began (they are evidence): dropping
            # the fit at every step drops it once
            self._fits.pop(gpu_type, None)
            keep = math.exp((since - now) / self.memory_s)
            for ratios in (self.ttft_ratio, self.tpot_ratio):
                ratio = ratios.get(gpu_type, 1.0)
                if ratio > 1.0:
                    ratios[gpu_type] = ratio**keep
            if gpu_type in self.overhead_s:
                self.overhead_s[gpu_type] *= keep
            self._aged_to[gpu_type] = now
