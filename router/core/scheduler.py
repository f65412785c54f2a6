"""The scheduler: one object that the live router and the simulator both drive.

route() picks a backend with the policy and books the request's cost in the ledger;
finish() releases it at end-of-stream and feeds what was learned back (costs, health)."""

from __future__ import annotations

import enum
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpuroute.router.core.backend import Backend, BackendSet
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.health import BackendHealth, HealthEvents
from gpuroute.router.core.ledger import OutstandingWork
from gpuroute.router.core.policies import PickContext, Policy
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


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, as far as the backend's health and the cost model care."""

    ok: bool
    output_tokens: int = 0
    prompt_tokens: int | None = None  # what the output length is learned against
    prefill_s_per_token: float | None = None  # only when measured without queueing
    decode_s_per_token: float | None = None  # step time / batch, the throughput cost
    latency_ratio: float | None = None  # observed / expected duration, for gray failures
    fatal: bool = False  # the backend is certainly down (connection refused): trip now


class Scheduler:
    def __init__(
        self,
        backends: BackendSet,
        policy: Policy,
        estimator: CostEstimator | None = None,
        health: BackendHealth | None = None,
    ) -> None:
        self.backends = backends
        self.policy = policy
        self.estimator = estimator or CostEstimator()
        self.health = health if health is not None else BackendHealth(backends)
        self.ledger = OutstandingWork()

    def context(self, request: RequestInfo, now: float, rng: random.Random) -> PickContext:
        return PickContext(request, self.backends, self.estimator, now, rng)

    def route(
        self,
        request: RequestInfo,
        now: float,
        rng: random.Random,
        exclude: Collection[str] = (),
        prefer: str | None = None,
        *,
        explain: bool = False,
    ) -> Decision | None:
        """Choose a backend and book the request; None when no backend can take it.
        `prefer` (a session's remembered backend) is taken over the policy's pick while it
        is a candidate; a wanted half-open probe still comes first. With `explain`, the
        decision carries every candidate's score as it was before the booking."""
        candidates = self.candidates(request, exclude)
        if not candidates:
            return None
        ctx = self.context(request, now, rng)
        # scored before the pick too: a policy may learn from its pick (prefix_affinity)
        scores = self._scores(ctx, candidates) if explain else None
        backend, reason = self._choose(ctx, candidates, prefer)
        cost = ctx.cost_on(backend)
        self.ledger.start(request.request_id, backend, cost)
        return Decision(backend, cost, len(candidates), reason, scores)

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
    ) -> tuple[Backend, PickReason]:
        # A half-open breaker gets its probe whatever the policy thinks of a warming backend,
        # or it would never see traffic again while healthier backends have room.
        if self.health.half_open and not self.health.active_probes:  # 1,000s of backends
            probe = next((b for b in candidates if self.health.wants_probe(b)), None)
            if probe is not None:
                return probe, PickReason.PROBE
        if prefer is not None:
            remembered = next((b for b in candidates if b.backend_id == prefer), None)
            if remembered is not None:
                return remembered, PickReason.SESSION
        return self.policy.pick(ctx, candidates), PickReason.POLICY

    def _scores(self, ctx: PickContext, candidates: Sequence[Backend]) -> Scores:
        return tuple((b.backend_id, self.policy.score(ctx, b)) for b in candidates)

    def finish(
        self, request_id: object, model: str, outcome: Outcome, now: float
    ) -> HealthEvents | None:
        """End of stream (or failure, or disconnect): release work, learn, update health."""
        entry = self.ledger.finish(request_id)
        if entry is None:
            return None
        backend, _ = entry
        if outcome.ok:
            if outcome.output_tokens:
                self.estimator.observe_output(model, outcome.output_tokens, outcome.prompt_tokens)
            self.estimator.observe_rates(
                backend.gpu_type,
                prefill_s_per_token=outcome.prefill_s_per_token,
                decode_s_per_token=outcome.decode_s_per_token,
            )
        return self.health.record(
            backend, outcome.ok, now, outcome.latency_ratio, fatal=outcome.fatal
        )

    def judge(self, backend: Backend, *, ok: bool, now: float) -> HealthEvents:
        """A health verdict on a backend reached after its booking was released."""
        return self.health.record(backend, ok, now)

    def release(self, request_id: object) -> None:
        """Drop a request's booking with no health verdict (client gone, request refused)."""
        self.ledger.finish(request_id)

    def tick(self, now: float) -> HealthEvents:
        return self.health.tick(now)
