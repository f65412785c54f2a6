"""The scheduler: one object that the live router and the simulator both drive.

route() picks a backend with the policy and books the request there (its outstanding work,
its latency-model booking, the margin it was placed under), on the request's lifetime;
finish() releases it at end-of-stream and feeds what was learned back (costs, health)."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gpuroute.router.core.backend import Backend, BackendSet
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.health import BackendHealth, HealthEvents
from gpuroute.router.core.latency import LatencyModel, Prediction
from gpuroute.router.core.ledger import OutstandingWork
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies import PickContext, Policy
from gpuroute.router.core.policies.base import Verdict
from gpuroute.router.core.request import RequestInfo


class PickReason(enum.Enum):
    """Why this backend: a half-open breaker's probe, a session's remembered backend, or
    the policy's choice."""

    PROBE = "probe"
    SESSION = "session"
    POLICY = "policy"


Scores = tuple[tuple[str, float | None], ...]


@dataclass(frozen=True, slots=True)
class Decision:
    backend: Backend
    cost_s: float  # booked in the ledger until finish()
    candidates: int
    reason: PickReason = PickReason.POLICY
    # each candidate's policy score before this request was booked (only when asked)
    scores: Scores | None = None
    prediction: Prediction | None = None  # TTFT and TPOT there, when a latency model runs
    fits: bool = True  # predicted to meet the request's SLO (False only from predicting policies)
    booked: bool = True  # False: a predicted miss held back for admission (nothing booked)


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
        self._chooses = getattr(policy, "choose", None)  # a predicting policy's full verdict
        # it predicts SLO misses, which admission can then hold instead of sending
        self.predicts_slo = self._chooses is not None
        self._weighs_preference = getattr(policy, "honours_preference", False)
        self._observes_slo = getattr(policy, "observe_slo", None)
        # called whenever a booking ends or a first token arrives: room may have freed
        # for requests held by SLO-aware admission
        self.on_room: Callable[[], None] | None = None
        # a predicted miss was held back since the last tick: demand the latency model's
        # lessons are turning away (only then do idle GPU types forget pessimistic ones)
        self._turned_away = False

    def context(
        self, request: RequestInfo, now: float, rng: random.Random, prefer: str | None = None
    ) -> PickContext:
        preferred = prefer if self._weighs_preference else None
        return PickContext(
            request, self.backends, self.estimator, now, rng, self.latency, preferred
        )

    def route(
        self,
        life: RequestLifetime,
        now: float,
        rng: random.Random,
        prefer: str | None = None,
        *,
        explain: bool = False,
        hold_misses: bool = False,
    ) -> Decision | None:
        """Choose a backend the request has not tried and book it there (on `life`); None
        when no backend can take it. `prefer` (a session's remembered backend) is taken over
        the policy's pick while it is a candidate (a predicting policy takes it only while it
        meets the SLO); a wanted half-open probe still comes first. With `explain`, the
        decision carries every candidate's score as it was before the booking. With
        `hold_misses`, a predicted SLO miss comes back unbooked (`booked=False`) for
        admission to hold or refuse."""
        request = life.info
        candidates = self.candidates(request, life.tried)
        if not candidates:
            return None
        ctx = self.context(request, now, rng, prefer)
        # scored before the pick too: a policy may learn from its pick (prefix_affinity)
        scores = self._scores(ctx, candidates) if explain else None
        backend, reason, verdict = self._choose(ctx, candidates, prefer)
        cost = ctx.cost_on(backend)
        prediction = verdict.prediction if verdict is not None else None
        fits = verdict is None or verdict.fits
        if hold_misses and not fits:
            self._turned_away = True
            return Decision(
                backend, cost, len(candidates), reason, scores, prediction, fits=False, booked=False
            )
        if self.latency is not None:
            prediction = self._book_latency(ctx, life, backend, verdict)
        life.needed = verdict.needed if verdict is not None else None
        life.work = self.ledger.start(backend, cost)
        return Decision(backend, cost, len(candidates), reason, scores, prediction, fits=fits)

    def _book_latency(
        self, ctx: PickContext, life: RequestLifetime, backend: Backend, verdict: Verdict | None
    ) -> Prediction:
        """Book the request in the latency model with what the policy predicted there (or,
        for a policy that does not predict, a prediction made now)."""
        latency, request = self.latency, ctx.request
        assert latency is not None
        prompt, output = request.prompt_tokens, ctx.expected_output
        if verdict is not None:  # the policy predicted where it chose
            prediction = verdict.prediction
        else:
            prediction = latency.predict(backend, prompt, prompt, output, ctx.now)
        # a stream is protected from later prefills' stalls only when its length is known:
        # its max_tokens, where the estimator is told that is what it generates
        known = self.estimator.exact_max_tokens and request.max_tokens is not None
        bound = ctx.slo.tpot_s if known else None
        life.latency = latency.book(backend, prompt, output, ctx.now, prediction, bound)
        return prediction

    def candidates(self, request: RequestInfo, exclude: Collection[str] = ()) -> list[Backend]:
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
        return candidates

    def _choose(
        self, ctx: PickContext, candidates: Sequence[Backend], prefer: str | None
    ) -> tuple[Backend, PickReason, Verdict | None]:
        # A half-open breaker gets its probe whatever the policy thinks of a warming backend,
        # or it would never see traffic again while healthier backends have room.
        if self.health.half_open and not self.health.active_probes:  # 1,000s of backends
            probe = next((b for b in candidates if self.health.wants_probe(b)), None)
            if probe is not None:
                return probe, PickReason.PROBE, None
        if self._chooses is not None:
            verdict = self._chooses(ctx, candidates)
            reason = PickReason.SESSION if verdict.preferred else PickReason.POLICY
            return verdict.backend, reason, verdict
        if prefer is not None:
            remembered = next((b for b in candidates if b.backend_id == prefer), None)
            if remembered is not None:
                return remembered, PickReason.SESSION, None
        return self.policy.pick(ctx, candidates), PickReason.POLICY, None

    def _scores(self, ctx: PickContext, candidates: Sequence[Backend]) -> Scores:
        return tuple((b.backend_id, self.policy.score(ctx, b)) for b in candidates)

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
        if outcome.met_slo is not None and self._observes_slo is not None:
            self._observes_slo(life.needed, outcome.met_slo, backend, now)
        life.work = life.latency = life.needed = None
        if outcome.ok and outcome.output_tokens:
            self.estimator.observe_output(
                life.info.model, outcome.output_tokens, outcome.prompt_tokens
            )
        events = self.health.record(
            backend, outcome.ok, now, outcome.latency_ratio, fatal=outcome.fatal
        )
        if self.on_room is not None:
            self.on_room()
        return events

    def judge(self, backend: Backend, *, ok: bool, now: float) -> HealthEvents:
        """A health verdict on a backend reached after its booking was released."""
        return self.health.record(backend, ok, now)

    def first_token(self, life: RequestLifetime, now: float, ttft_s: float | None = None) -> None:
        """The request's first token arrived (the latency model resynchronises and learns)."""
        if self.latency is not None and life.latency is not None:
            self.latency.first_token(life.latency, now, ttft_s)
        if self.on_room is not None:
            self.on_room()

    def release(self, life: RequestLifetime) -> None:
        """Drop a request's booking with no health verdict (client gone, request refused)."""
        work = life.work
        if work is None or not self.ledger.finish(work):
            return
        if self.latency is not None and life.latency is not None:
            self.latency.finish(life.latency, None, work.backend.in_flight)
        life.work = life.latency = life.needed = None
        if self.on_room is not None:
            self.on_room()

    def tick(self, now: float) -> HealthEvents:
        if self.latency is not None:
            turned_away, self._turned_away = self._turned_away, False
            busy = {b.gpu_type for b in self.backends if b.in_flight} if turned_away else ()
            self.latency.age(now, busy, turned_away=turned_away)
        return self.health.tick(now)
