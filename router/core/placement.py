"""Where each attempt of a request goes: the loop the live router and the simulator share.

Sans-IO: `route` asks the scheduler for a backend and books it, or holds a predicted SLO
miss in the hold queue (only a first attempt: a retry goes where it can); `offer_room`
gives room that freed up to held requests, most important first; `failed` records a failed
attempt and says whether another may follow and after what backoff; `expire` refuses the
held requests whose TTFT budget ran out. The caller sends, waits and parks
(router/attempts/forward.py and router/front/slo.py live, sim/simulator.py in simulated time)."""

from __future__ import annotations

import copy
import enum
import math
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

# a class counts as in the traffic this long after one of its requests was placed
PRESENT_S = 10.0
# and a less important request may then be placed where it waits at most this share of
# that class's TTFT budget: the rest is the more important class's headroom
QUEUE_SHARE = 0.25


class Step(enum.Enum):
    SEND = "send"  # booked on `decision.backend`: send it there
    HOLD = "hold"  # no backend is predicted to meet its SLO: it waits in the hold queue
    NONE = "none"  # no backend can take it


@dataclass(frozen=True, slots=True)
class Placement:
    step: Step
    decision: Decision | None = None
    refused: tuple[Shed, ...] = ()  # held requests the hold queue refused to make room
    # held for a more important class's sake (it may have fit), not because its pool is
    # short: no standby comes in for it, and it is no sign to grow the pool
    yielded: bool = False


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
        # None: predicted misses are sent (no SLO-aware admission); else they are held while
        # the scheduler's policy predicts them (a reload may change which policy that is)
        self.holds = holds
        self.standby = standby  # warm backends brought in before a request would wait
        self._pressed: dict[int, float] = {}  # class rank -> until when one was held
        self._seen: dict[int, tuple[float, float]] = {}  # class rank -> (last seen, TTFT)

    def route(
        self,
        life: RequestLifetime,
        now: float,
        rng: random.Random,
        prefer: str | None = None,
        trace: PickTrace | None = None,
    ) -> Placement:
        hold = (
            self.holds is not None
            and self.scheduler.predicts_slo
            and not life.tried
            and life.info.holds
        )
        defer = hold and self._behind(life, now)
        cap = self._cap(life, now) if hold else math.inf
        decision = self.scheduler.route(
            life, now, rng, prefer, trace=trace, hold_misses=hold, defer=defer, ttft_cap=cap
        )
        yielded = defer or cap < math.inf
        if (decision is None or not decision.booked) and not yielded and self._promoted(life, now):
            # a warm standby backend came in: it may take the request now (one per
            # request: one that would miss even there does not bring in the whole pool)
            decision = self.scheduler.route(
                life, now, rng, prefer, trace=trace, hold_misses=hold, defer=defer, ttft_cap=cap
            )
        if decision is None:
            return Placement(Step.NONE)
        if not decision.booked:
            return Placement(Step.HOLD, decision, self._hold(life, now), yielded)
        self.sent(life, decision, now)
        return Placement(Step.SEND, decision)

    def _behind(self, life: RequestLifetime, now: float) -> bool:
        """Whether a more important class is held, or was within its TTFT budget: the room
        that frees is its first, and an engine queue this request would deepen (engines
        serve first come, first served) is one it would wait behind. So this one waits in
        the hold queue, where a more important request overtakes it, while its own budget
        lasts."""
        slo = life.info.slo
        if slo is None or self.holds is None:
            return False
        rank = self.holds.rank(slo.name)
        return any(until > now for r, until in self._pressed.items() if r < rank)

    def _cap(self, life: RequestLifetime, now: float) -> float:
        """The first-token wait a request may be placed at: engines serve their queues in
        order, so while a more important class is in the traffic (one was placed within
        PRESENT_S), a less important request that would wait longer than QUEUE_SHARE of
        that class's TTFT budget waits in the hold queue instead, where the more
        important overtake it, rather than in an engine's queue, where they would wait
        behind it."""
        slo = life.info.slo
        if slo is None or self.holds is None:
            return math.inf
        rank = self.holds.rank(slo.name)
        caps = [t for r, (at, t) in self._seen.items() if r < rank and now - at <= PRESENT_S]
        return QUEUE_SHARE * min(caps, default=math.inf)

    def _promoted(self, life: RequestLifetime, now: float) -> bool:
        """No backend in rotation would serve it in time (or at all): bring in a warm
        standby one for its model, if there is one (before it waits or is refused)."""
        if self.standby is None:
            return False
        return self.standby.promote(life.info.model, now) is not None

    def sent(self, life: RequestLifetime, decision: Decision, now: float | None = None) -> None:
        life.move(Event.PLACE)
        life.tried.add(decision.backend.backend_id)
        slo = life.info.slo
        if now is not None and slo is not None and self.holds is not None:
            # its class is in the traffic and served: less important ones leave it room (a
            # class no backend can serve in time caps nobody)
            self._seen[self.holds.rank(slo.name)] = (now, slo.ttft_s)

    def _hold(self, life: RequestLifetime, now: float) -> tuple[Shed, ...]:
        assert self.holds is not None
        info = life.info
        assert info.slo is not None and info.arrived_at is not None
        if life.phase is not Phase.HELD:
            life.move(Event.HOLD)
        rank = self.holds.rank(info.slo.name)
        self._pressed[rank] = max(self._pressed.get(rank, now), now + info.slo.ttft_s)
        return tuple(self.holds.hold(life, info.slo, info.arrived_at, now))

    def offer_room(
        self, now: float, rng: random.Random, traced: bool = False
    ) -> Iterator[tuple[RequestLifetime, Decision]]:
        """Room may have freed: the first few held requests (most important first) routed
        again; each now booked leaves the hold queue and comes back to be sent (before the
        next is routed: a send that fails at once changes what the next one sees). Once
        one finds no room, no less important one is offered any."""
        if not self.holds:
            return
        unplaced: int | None = None  # the most important class that found no room
        for life in self.holds.peek(OFFERS_PER_EVENT):
            assert life.info.slo is not None  # held requests have a class
            rank = self.holds.rank(life.info.slo.name)
            if unplaced is not None and rank > unplaced:
                return  # the room it did not find is not for less important ones either
            trace = PickTrace() if traced else None
            cap = self._cap(life, now)
            decision = self.scheduler.route(
                life, now, rng, trace=trace, hold_misses=True, ttft_cap=cap
            )
            if decision is not None and decision.booked:
                self.holds.take(life, now)
                self.sent(life, decision, now)
                yield life, decision
            elif unplaced is None:
                unplaced = rank

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
