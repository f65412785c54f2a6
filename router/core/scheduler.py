"""The scheduler: one object that the live router and the simulator both drive.

route() picks a backend with the policy and books the request there (its outstanding work,
its latency-model booking, the margin it was placed under), on the request's lifetime;
finish() releases it at end-of-stream and feeds what was learned back (costs, health)."""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpuroute.router.core.backend import ROUTABLE_STATES, Backend, BackendSet, BackendState
from gpuroute.router.core.cost import CostEstimator, GpuCostPrior
from gpuroute.router.core.health import BackendHealth, HealthEvents
from gpuroute.router.core.latency import LatencyModel, Prediction
from gpuroute.router.core.latency_prior import LatencyPrior
from gpuroute.router.core.ledger import OutstandingWork
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies import PickContext, Policy
from gpuroute.router.core.policies.base import PickTrace, Verdict
from gpuroute.router.core.request import RequestInfo


class PickReason(enum.Enum):
    """Why this backend: a half-open breaker's probe, a session's remembered backend, or
    the policy's choice."""

    PROBE = "probe"
    SESSION = "session"
    POLICY = "policy"


@dataclass(frozen=True, slots=True)
class Decision:
    backend: Backend
    cost_s: float  # booked in the ledger until finish()
    candidates: int
    reason: PickReason = PickReason.POLICY
    # each stage of the pick, as it ran before this request was booked (only when asked)
    trace: PickTrace | None = None
    prediction: Prediction | None = None  # TTFT and TPOT there, when a latency model runs
    fits: bool = True  # predicted to meet the request's SLO (False only from predicting policies)
    booked: bool = True  # False: a predicted miss held back for admission (nothing booked)
    model: str = ""  # the model it serves: the request's, or a fallback's


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, as far as the backend's health and the cost model care."""

    ok: bool
    output_tokens: int = 0
    prompt_tokens: int | None = None  # what the output length is learned against
    latency_ratio: float | None = None  # observed / expected duration, for gray failures
    tpot_s: float | None = None  # observed time per output token, for the latency model
    met_slo: bool | None = None  # whether it met its SLO class (None: not judged)
    fatal: bool = False  # the backend is certainly down (connection refused): trip now


class Scheduler:
    def __init__(
        self,
        backends: BackendSet,
        policy: Policy,
        estimator: CostEstimator | None = None,
        health: BackendHealth | None = None,
        latency: LatencyModel | None = None,
    ) -> None:
        self.backends = backends
        self.policy = policy
        self.estimator = estimator or CostEstimator()
        self.health = health if health is not None else BackendHealth(backends)
        self.latency = latency
        self.ledger = OutstandingWork()
        # a predicted miss was held back since the last tick: demand the latency model's
        # lessons are turning away (only then do idle GPU types forget pessimistic ones)
        self._turned_away = False

    def add_kind(self, kind: str, cost: GpuCostPrior, latency: LatencyPrior | None) -> None:
        """An engine kind seen for the first time (a member that joined): its priors."""
        self.estimator.add_rates(kind, cost)
        if self.latency is not None and latency is not None:
            self.latency.priors.setdefault(kind, latency)

    @property
    def predicts_slo(self) -> bool:
        """Its policy predicts SLO misses, which admission can then hold instead of sending."""
        return self.policy.predicts_slo

    def context(
        self,
        request: RequestInfo,
        now: float,
        rng: random.Random,
        prefer: str | None = None,
        trace: PickTrace | None = None,
    ) -> PickContext:
        return PickContext(
            request, self.backends, self.estimator, now, rng, self.latency, prefer, trace
        )

    def route(
        self,
        life: RequestLifetime,
        now: float,
        rng: random.Random,
        prefer: str | None = None,
        *,
        trace: PickTrace | None = None,
        hold_misses: bool = False,
        defer: bool = False,
        ttft_cap: float = math.inf,
    ) -> Decision | None:
        """Choose a backend the request has not tried and book it there (on `life`); None
        when no backend can take it. `prefer` (a session's remembered backend) is taken over
        the policy's pick while it survives the policy's filter (for a predicting policy:
        while it is predicted to meet the SLO); a wanted half-open probe still comes first.
        With a `trace`, each stage writes down what it did, before the booking. With
        `hold_misses`, a predicted SLO miss comes back unbooked (`booked=False`) for
        admission to hold or refuse; with `defer` too, any pick does (more important
        requests are waiting for room). `ttft_cap` bounds the predicted TTFT a fit may
        have, whatever the request's own class allows."""
        chosen = self._choose_model(life, now, rng, prefer, trace, ttft_cap)
        if chosen is None:
            return None
        ctx, backend, reason, verdict, count = chosen
        cost = ctx.cost_on(backend)
        prediction, fits = verdict.prediction, verdict.fits
        model = ctx.request.model
        if hold_misses and (defer or not fits):
            self._turned_away |= not fits
            return Decision(
                backend, cost, count, reason, trace, prediction, fits=False, booked=False,
                model=model,
            )  # fmt: skip
        if self.latency is not None:
            prediction = self._book_latency(ctx, life, backend, verdict)
        life.needed = verdict.needed
        life.model = model
        life.work = self.ledger.start(backend, cost)
        return Decision(backend, cost, count, reason, trace, prediction, fits=fits, model=model)

    def route_unparsed(self, life: RequestLifetime) -> Backend | None:
        """A passthrough request (an engine path forwarded unparsed, for no model): the ready
        backend with the fewest requests booked, booked there in the ledger like any request
        so that concurrent ones spread; None when no backend is ready. Its size is unknown,
        so it is booked at the default request's cost: its prompt as estimated from its body
        and the estimator's default output length. Its booking is released with no verdict
        when its lifetime closes: an unparsed answer teaches neither costs nor health."""
        ready = [b for b in self.backends if b.state is BackendState.READY]
        if not ready:
            return None
        backend = min(ready, key=lambda b: b.in_flight)  # ties: the first in fleet order
        estimator = self.estimator
        cost = estimator.seconds(
            backend.gpu_type, backend.capacity, life.info.prompt_tokens,
            estimator.default_output_tokens,
        )  # fmt: skip
        life.work = self.ledger.start(backend, cost)
        return backend

    def _choose_model(
        self,
        life: RequestLifetime,
        now: float,
        rng: random.Random,
        prefer: str | None,
        trace: PickTrace | None,
        ttft_cap: float = math.inf,
    ) -> tuple[PickContext, Backend, PickReason, Verdict, int] | None:
        """The pick for the request's model, or for the first of its fallbacks that has a
        candidate predicted to meet the SLO when the model has none (no healthy backend, or
        a predicted miss everywhere). With no fit anywhere, the model's own miss (the first
        model with candidates) goes back, for admission to hold or refuse."""
        miss = None
        for model in life.info.models:
            request = life.info if model == life.info.model else life.info.serving(model)
            candidates = self.candidates(request, life.tried, trace)
            if not candidates:
                continue
            ctx = self.context(request, now, rng, prefer, trace)
            ctx.ttft_cap = ttft_cap
            if trace is not None and trace.full and not self.policy.traces_scores:
                # scored before the pick: a policy may learn from its pick (prefix_affinity)
                for b in candidates:
                    trace.row(b)["score"] = self.policy.score(ctx, b)
            backend, reason, verdict = self._choose(ctx, candidates, prefer)
            if trace is not None and model != life.info.model:
                trace.fallback = model
            if verdict.fits:
                return ctx, backend, reason, verdict, len(candidates)
            if miss is None:
                miss = ctx, backend, reason, verdict, len(candidates)
            prefer = None  # a session's backend serves its model, not a fallback
        return miss

    def _book_latency(
        self, ctx: PickContext, life: RequestLifetime, backend: Backend, verdict: Verdict
    ) -> Prediction:
        """Book the request in the latency model with what the policy predicted there (or,
        for a policy that does not predict, a prediction made now)."""
        latency, request = self.latency, ctx.request
        assert latency is not None
        prompt, output = request.prompt_tokens, ctx.expected_output
        prediction = verdict.prediction  # what the policy predicted where it chose, if it did
        if prediction is None:
            prediction = latency.predict(backend, prompt, prompt, output, ctx.now)
        # a stream is protected from later prefills' stalls only when its length is known:
        # its max_tokens, where the estimator is told that is what it generates
        known = self.estimator.exact_max_tokens and request.max_tokens is not None
        bound = ctx.slo.tpot_s if known else None
        life.latency = latency.book(backend, prompt, output, ctx.now, prediction, bound)
        return prediction

    def candidates(
        self, request: RequestInfo, exclude: Collection[str] = (), trace: PickTrace | None = None
    ) -> list[Backend]:
        """The backends that may take `request`: routable for its model, not excluded, and
        a half-open one only while it wants its probe."""
        candidates = self.backends.routable(request.model)
        half_open = self.health.half_open
        if exclude or half_open:
            # a half-open backend takes only its probe (wants_probe below, or active checks)
            candidates = [
                b
                for b in candidates
                if b.backend_id not in exclude
                and (b.backend_id not in half_open or self.health.wants_probe(b))
            ]
        if trace is not None:
            trace.candidates = len(candidates)
            everyone = trace.full or not candidates
            trace.excluded = self._excluded(request.model, exclude, everyone)
        return candidates

    def _excluded(self, model: str, tried: Collection[str], everyone: bool) -> dict[str, str]:
        """Why each backend serving `model` is no candidate (for the trace): of the whole
        fleet when `everyone`, else of those tried and those half-open (cheap)."""
        why: dict[str, str] = {}
        if everyone:
            backends: Collection[Backend] = self.backends
        else:
            ids = set(tried) | set(self.health.half_open)
            backends = [self.backends.get(i) for i in sorted(ids) if i in self.backends]
        for b in backends:
            if model not in b.models:
                continue
            if b.backend_id in tried:
                why[b.backend_id] = "tried by an earlier attempt"
            elif b.state not in ROUTABLE_STATES:
                why[b.backend_id] = b.condition
            elif b.backend_id in self.health.half_open and not self.health.wants_probe(b):
                why[b.backend_id] = "breaker half-open, its probe is out"
        return why

    def _choose(
        self, ctx: PickContext, candidates: Sequence[Backend], prefer: str | None
    ) -> tuple[Backend, PickReason, Verdict]:
        """The pipeline: a wanted probe, else the policy's shortlist, then the session's
        backend if it survived it, else the policy's pick; the policy learns where it went."""
        # A half-open breaker gets its probe whatever the policy thinks of a warming backend,
        # or it would never see traffic again while healthier backends have room.
        if self.health.half_open and not self.health.active_probes:  # 1,000s of backends
            probe = next((b for b in candidates if self.health.wants_probe(b)), None)
            if probe is not None:
                return probe, PickReason.PROBE, Verdict(probe)
        policy = self.policy
        shortlist = policy.shortlist(ctx, candidates)
        if shortlist.miss is not None:
            return shortlist.miss.backend, PickReason.POLICY, shortlist.miss
        kept = shortlist.kept
        remembered = None
        if prefer is not None:
            remembered = next((b for b in kept if b.backend_id == prefer), None)
        if remembered is not None:
            return remembered, PickReason.SESSION, policy.placed(ctx, remembered, preferred=True)
        backend = policy.pick(ctx, kept)
        return backend, PickReason.POLICY, policy.placed(ctx, backend, preferred=False)

    def finish(self, life: RequestLifetime, outcome: Outcome, now: float) -> HealthEvents | None:
        """End of stream (or failure, or disconnect): release work, learn, update health.
        None when nothing was booked (or it was released already)."""
        work = life.work
        if work is None or not self.ledger.finish(work):
            return None
        backend = work.backend
        if self.latency is not None and life.latency is not None:
            self.latency.finish(
                life.latency,
                outcome.tpot_s if outcome.ok else None,
                backend.in_flight,
                outcome.output_tokens,
                now,
            )
        if outcome.met_slo is not None:
            slo = life.info.slo
            name = slo.name if slo is not None else ""
            self.policy.observe_slo(life.needed, outcome.met_slo, backend, now, name)
        life.work = life.latency = life.needed = None
        if outcome.ok and outcome.output_tokens:
            self.estimator.observe_output(
                life.info.model, outcome.output_tokens, outcome.prompt_tokens
            )
        return self.health.record(
            backend, outcome.ok, now, outcome.latency_ratio, fatal=outcome.fatal
        )

    def judge(self, backend: Backend, *, ok: bool, now: float) -> HealthEvents:
        """A health verdict on a backend reached after its booking was released."""
        return self.health.record(backend, ok, now)

    def first_token(self, life: RequestLifetime, now: float, ttft_s: float | None = None) -> None:
        """The request's first token arrived (the latency model resynchronises and learns)."""
        if self.latency is not None and life.latency is not None:
            self.latency.first_token(life.latency, now, ttft_s)

    def release(self, life: RequestLifetime) -> bool:
        """Drop a request's booking with no health verdict (client gone, request refused);
        False when it held none."""
        work = life.work
        if work is None or not self.ledger.finish(work):
            return False
        if self.latency is not None and life.latency is not None:
            self.latency.finish(life.latency, None, work.backend.in_flight)
        life.work = life.latency = life.needed = None
        return True

    def tick(self, now: float) -> HealthEvents:
        if self.latency is not None:
            turned_away, self._turned_away = self._turned_away, False
            busy = {b.gpu_type for b in self.backends if b.in_flight} if turned_away else ()
            self.latency.age(now, busy, turned_away=turned_away)
        return self.health.tick(now)
