"""The live router's admission in simulated time: every arrival is offered to the router's
own sans-IO `Admission` (router/core/admission.py), as the live gate offers it
(router/front/admission.py). It goes at once, waits for an in-flight slot, or is refused;
slots freed while requests wait let them in once the event at hand is handled, as the live
gate's woken waiters run after the code that freed the slot.

Without `router.max_inflight` no backend limits what it takes, and every request goes at
once (what the simulator always did); with it, each backend takes that many at a time, as
the live router's `backends[].max_inflight`, and a warm standby comes in before anyone
waits."""

from __future__ import annotations

from collections.abc import Callable

from gpuroute.router.core.admission import Admission, AdmissionSettings, Verdict
from gpuroute.router.core.backend import BackendSet
from gpuroute.router.core.lifetime import Event, RequestLifetime
from gpuroute.router.core.standby import StandbyRotation


class SimAdmission:
    def __init__(
        self,
        max_inflight: int | None,
        backends: BackendSet,
        standby: StandbyRotation | None,
        *,
        go: Callable[[RequestLifetime, float], None],
        refuse: Callable[[RequestLifetime], None],
    ) -> None:
        limits = None
        if max_inflight is not None:
            limits = {b.backend_id: max_inflight for b in backends}
        self.core = Admission(AdmissionSettings(), backends, limits, standby=standby)
        self.go, self.refuse = go, refuse  # route an admitted request; end a refused one
        self.due = False  # a slot freed while requests wait for one

    def arrive(self, life: RequestLifetime, now: float) -> None:
        offer = self.core.offer(life, now)
        for shed in offer.shed:  # the newcomer, or a waiter it displaced
            self.refuse(shed.item)
        if offer.verdict is Verdict.ADMIT:
            life.move(Event.ADMIT)
            self.go(life, now)
        elif offer.verdict is Verdict.QUEUED:
            life.move(Event.QUEUE)

    def released(self) -> None:
        """An admitted request ended: its slot is free (waiters go at `let_in`)."""
        self.core.release()
        self.due = bool(len(self.core.queue))  # only limited admission ever queues

    def let_in(self, now: float) -> None:
        """The waiters the core lets in go; those found past their deadline are refused."""
        self.due = False
        for life, shed in self.core.dispatch(now):
            if shed is not None:
                self.refuse(life)
            else:
                life.move(Event.ADMIT)
                self.go(life, now)

    def tick(self, now: float) -> None:
        """As the live router's tick: waiters past their deadline go, then room is offered."""
        for shed in self.core.expire(now):
            self.refuse(shed.item)
        self.let_in(now)
