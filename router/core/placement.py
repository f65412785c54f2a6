"""Where each attempt of a request goes: the loop the live router and the simulator share.

Sans-IO: `route` asks the scheduler for a backend and books it, or holds a predicted SLO
miss in the hold queue (only a first attempt: a retry goes where it can); `offer_room`
gives room that freed up to held requests, most important first; `failed` records a failed
attempt and says whether another may follow and after what backoff; `expire` refuses the
held requests whose TTFT budget ran out. The caller sends, waits and parks
(router/forward.py and router/slo_gate.py live, sim/simulator.py in simulated time)."""

from __future__ import annotations

import copy
import enum
import random
from collections.abc import Iterator
from dataclasses import dataclass

from gpuroute.router.core.admission import Shed
from gpuroute.router.core.lifetime import Event, Phase, RequestLifetime
from gpuroute.router.core.policies.base import PickTrace
from gpuroute.router.core.retry import FailureKind, RetryBudget, Verdict
from gpuroute.router.core.scheduler import Decision, Scheduler
from gpuroute.router.core.slo_admission import OFFERS_PER_EVENT, HoldQueue
from gpuroute.router.core.standby import StandbyRotation


class Step(enum.Enum):
    SEND = "send"  # booked on `decision.backend`: send it there
    HOLD = "hold"  # no backend is predicted to meet its SLO: it waits in the hold queue
    NONE = "none"  # no backend can take it


@dataclass(frozen=True, slots=True)
class Placement:
    step: Step
    decision: Decision | None = None
    refused: tuple[Shed, ...] = ()  # held requests the hold queue refused to make room


@dataclass(frozen=True, slots=True)
class Retry:
    """After a failed attempt: `go` with its backoff, or the verdict that stops it."""

    verdict: Verdict
    delay_s: float = 0.0

    @property
    def go(self) -> bool:
        return self.verdict is Verdict.GO


class AttemptLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        budget: RetryBudget,
        holds: HoldQueue | None,
        standby: StandbyRotation | None = None,
    ) -> None:
        self.scheduler, self.budget = scheduler, budget
        self.holds = holds  # None: predicted misses are sent (no SLO-aware admission)
        self.standby = standby  # warm backends brought in before a request would wait

    def route(
        self,
        life: RequestLifetime,
        now: float,
        rng: random.Random,
        prefer: str | None = None,
        trace: PickTrace | None = None,
    ) -> Placement:
        hold = self.holds is not None and not life.tried and life.info.holds
        # a more important request waiting for room gets it first: this one waits too
        slo = life.info.slo
        defer = hold and slo is not None and self.holds.waiting_before(slo)  # type: ignore[union-attr]
        decision = self.scheduler.route(
            life, now, rng, prefer, trace=trace, hold_misses=hold, defer=defer
        )
        if (decision is None or not decision.booked) and self._promoted(life, now):
            # a warm standby backend came in: it may take the request now (one per
            # request: one that would miss even there does not bring in the whole pool)
            decision = self.scheduler.route(
                life, now, rng, prefer, trace=trace, hold_misses=hold, defer=defer
            )
        if decision is None:
            return Placement(Step.NONE)
        if not decision.booked:
            return Placement(Step.HOLD, decision, self._hold(life, now))
        self.sent(life, decision)
        return Placement(Step.SEND, decision)

    def _promoted(self, life: RequestLifetime, now: float) -> bool:
        """No backend in rotation would serve it in time (or at all): bring in a warm
        standby one for its model, if there is one (before it waits or is refused)."""
        if self.standby is None:
            return False
        return self.standby.promote(life.info.model, now) is not None

    def sent(self, life: RequestLifetime, decision: Decision) -> None:
        life.move(Event.PLACE)
        life.tried.add(decision.backend.backend_id)

    def _hold(self, life: RequestLifetime, now: float) -> tuple[Shed, ...]:
        assert self.holds is not None
        info = life.info
        assert info.slo is not None and info.arrived_at is not None
        if life.phase is not Phase.HELD:
            life.move(Event.HOLD)
        return tuple(self.holds.hold(life, info.slo, info.arrived_at, now))

    def offer_room(
        self, now: float, rng: random.Random, traced: bool = False
    ) -> Iterator[tuple[RequestLifetime, Decision]]:
        """Room may have freed: the first few held requests (most important first) routed
        again; each now booked leaves the hold queue and comes back to be sent (before the
        next is routed: a send that fails at once changes what the next one sees)."""
        if not self.holds:
            return
        for life in self.holds.peek(OFFERS_PER_EVENT):
            trace = PickTrace() if traced else None
            decision = self.scheduler.route(life, now, rng, trace=trace, hold_misses=True)
            if decision is not None and decision.booked:
                self.holds.take(life, now)
                self.sent(life, decision)
                yield life, decision

    def expire(self, now: float) -> list[Shed]:
        """Held requests whose TTFT budget ran out, refused."""
        return list(self.holds.expire(now)) if self.holds is not None else []

    def continued(self, life: RequestLifetime, generated: int) -> None:
        """Its engine broke mid-stream after `generated` tokens: routed again as a request
        whose prompt holds them (their prefill redone where it goes on) and whose cap is
        what is left of it."""
        life.move(Event.CONTINUE)
        # its own copy: the request as admitted (its quota charge, its access line) stays
        life.info = info = copy.copy(life.info)
        info.prompt_tokens += generated
        if info.max_tokens is not None:
            info.max_tokens = max(info.max_tokens - generated, 1)

    def failed(self, life: RequestLifetime, kind: FailureKind, rng: random.Random) -> Retry:
        """A failed attempt (before any byte reached the client): may another follow?"""
        attempts = life.attempts
        attempts.failed(kind)
        verdict, delay = attempts.next(self.budget, rng)
        if verdict is Verdict.GO:
            life.move(Event.ATTEMPT_FAILED)
        return Retry(verdict, delay)
