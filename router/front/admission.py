"""The I/O side of admission control: waiters parked on futures while the core's Admission
(router/core/admission.py) decides.

A request is admitted at once while the backends serving its pool have free in-flight
slots and nobody of equal or higher priority waits; otherwise a warm standby backend of its
model comes in (its slots with it), or it waits (bounded, with its deadline) until a
finishing request frees a slot, or is shed with a Retry-After hint."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuroute.router.config.router import AdmissionConfig
from gpuroute.router.core.admission import Admission, AdmissionSettings, Shed, Verdict
from gpuroute.router.core.backend import BackendSet
from gpuroute.router.core.lifetime import Event, RequestLifetime
from gpuroute.router.core.standby import StandbyRotation
from gpuroute.router.observe.metrics import RouterMetrics

from gpuroute.openai_api import Rejection


def refusal(shed: Shed) -> Rejection:
    headers = {"Retry-After": str(shed.retry_after_s)}
    if shed.reason == "deadline":
        return Rejection(
            504, "deadline passed while queued", code="deadline_exceeded", headers=headers
        )
    message = "router queue is full; retry after the hinted delay"
    return Rejection(429, message, code=shed.reason, headers=headers)


class AdmissionGate:
    """The async shell of the core's Admission (router/core/admission.py): a waiter parks
    on a future, is woken with the core's verdict, and the shed are counted."""

    def __init__(
        self,
        config: AdmissionConfig,
        backends: BackendSet,
        max_inflight: dict[str, int],
        metrics: RouterMetrics,
        clock: Callable[[], float],
        standby: StandbyRotation | None = None,
    ) -> None:
        settings = AdmissionSettings(
            priorities=tuple(config.priorities),
            max_queue=config.max_queue,
            default_timeout_s=config.default_timeout_s,
        )
        self.core = Admission(
            settings,
            backends,
            max_inflight,
            reserved_top_fraction=config.reserved_top_fraction,
            standby=standby,
        )
        self.queue, self.slots = self.core.queue, self.core.slots
        self.has_room, self.set_limit = self.core.has_room, self.core.set_limit
        self.has_capacity = self.core.has_capacity
        self.metrics = metrics
        self.clock = clock

    async def admit(self, life: RequestLifetime, deadline_s: float | None) -> None:
        """Return when the request may go, holding an admission slot (`life.admitted`, until
        `pump`); raise Rejection when it is shed. It waits in the queue as its lifetime,
        parked on a future (`life.waiter`)."""
        now = self.clock()
        deadline = now + deadline_s if deadline_s is not None else None
        offer = self.core.offer(life, now, deadline)
        mine = None
        for shed in offer.shed:
            self.metrics.shed.labels(shed.reason).inc()
            if shed.item is life:
                mine = shed
            else:
                self._resolve(shed.item, shed)
        if offer.shed:
            self.metrics.queue_depth.set(len(self.queue))
        if mine is not None:
            raise refusal(mine)
        if offer.verdict is Verdict.ADMIT:
            return
        life.move(Event.QUEUE)
        future: asyncio.Future[Shed | None] = asyncio.get_running_loop().create_future()
        life.waiter = future
        self.metrics.queue_depth.set(len(self.queue))
        try:
            shed = await future
        except asyncio.CancelledError:
            # admitted just as the client left: its slot (`life.admitted`) goes back when
            # its lifetime closes
            self.core.withdraw(life)
            self.metrics.queue_depth.set(len(self.queue))
            raise
        finally:
            life.waiter = None
        if shed is not None:
            raise refusal(shed)

    def pump(self) -> None:
        """A request finished: free its slot and let the next waiters in."""
        self.core.release()
        self.dispatch()

    def dispatch(self) -> None:
        """Admit queued requests while there is room; shed those past their deadline."""
        if not len(self.queue):
            return  # the depth gauge was set when the queue last changed
        for life, shed in self.core.dispatch(self.clock()):
            if shed is not None:
                self.metrics.shed.labels(shed.reason).inc()
            self._resolve(life, shed)
        self.metrics.queue_depth.set(len(self.queue))

    def expire(self) -> None:
        """Shed queued requests whose deadline passed (called on the router's tick)."""
        for shed in self.core.expire(self.clock()):
            self.metrics.shed.labels(shed.reason).inc()
            self._resolve(shed.item, shed)
        self.metrics.queue_depth.set(len(self.queue))

    @staticmethod
    def _resolve(life: RequestLifetime, shed: Shed | None) -> None:
        future = life.waiter
        if isinstance(future, asyncio.Future) and not future.done():
            future.set_result(shed)
