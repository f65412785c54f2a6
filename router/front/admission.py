"""The I/O side of admission control: waiters parked on the core's AdmissionQueue.

A request is admitted at once while the backends serving its pool have free in-flight
slots and nobody of equal or higher priority waits; otherwise a warm standby backend of its
model comes in (its slots with it), or it waits (bounded, with its deadline) until a
finishing request frees a slot, or is shed with a Retry-After hint."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuroute.router.attempts.exchange import RequestState
from gpuroute.router.config.router import AdmissionConfig
from gpuroute.router.core.admission import (
    AdmissionQueue,
    AdmissionSettings,
    AdmissionSlots,
    Shed,
    Verdict,
)
from gpuroute.router.core.backend import ROUTABLE_STATES, BackendSet
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
    def __init__(
        self,
        config: AdmissionConfig,
        backends: BackendSet,
        max_inflight: dict[str, int],
        metrics: RouterMetrics,
        clock: Callable[[], float],
        standby: StandbyRotation | None = None,
    ) -> None:
        self.standby = standby  # warm backends brought in before a request would wait
        self.queue = AdmissionQueue(
            AdmissionSettings(
                priorities=tuple(config.priorities),
                max_queue=config.max_queue,
                default_timeout_s=config.default_timeout_s,
            )
        )
        self.priorities = tuple(config.priorities)
        self.slots = AdmissionSlots(config.reserved_top_fraction)
        self.backends = backends
        self._limits = dict(max_inflight)
        self._total_at = -1  # the backend set's version `_total` was counted at
        self._total = 0
        self.metrics = metrics
        self.clock = clock

    def has_room(self, backend_id: str) -> bool:
        """Is this backend below its own in-flight limit? (A session's remembered backend is
        kept only while it is.)"""
        return self.backends.get(backend_id).in_flight < self._limits.get(backend_id, 0)

    def set_limit(self, backend_id: str, max_inflight: int | None) -> None:
        """A discovered backend's in-flight limit (None: it left)."""
        if max_inflight is None:
            self._limits.pop(backend_id, None)
        else:
            self._limits[backend_id] = max_inflight
        self._total_at = -1

    def total_slots(self) -> int:
        """In-flight slots of every routable backend, recounted only when a backend or a
        limit changed (every request asks twice; a fleet has hundreds of backends)."""
        if self._total_at != self.backends.version:
            self._total = sum(
                self._limits.get(b.backend_id, 0)
                for b in self.backends
                if b.state in ROUTABLE_STATES
            )
            self._total_at = self.backends.version
        return self._total

    def has_capacity(self, priority: str | None = None) -> bool:
        """Room for one more request of `priority` (None: of the most important class)."""
        top = priority is None or priority == self.priorities[0]
        return self.slots.has_room(self.total_slots(), top)

    def _brought_in(self, model: str, now: float) -> bool:
        """A standby backend of `model` came into rotation (the slots are full)."""
        return self.standby is not None and self.standby.promote(model, now) is not None

    async def admit(self, life: RequestLifetime[RequestState], deadline_s: float | None) -> None:
        """Return when the request may go, holding an admission slot (`life.admitted`, until
        `pump`); raise Rejection when it is shed. It waits in the queue as its lifetime,
        parked on a future (its shell's `queued`)."""
        info = life.info
        now = self.clock()
        deadline = now + deadline_s if deadline_s is not None else None
        has_capacity = self.has_capacity(info.priority) or (
            self._brought_in(info.model, now) and self.has_capacity(info.priority)
        )
        offer = self.queue.offer(
            life,
            info.priority,
            now,
            has_capacity=has_capacity,
            deadline=deadline,
            tenant=info.tenant,
        )
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
            self._take_slot(life)
            return
        life.move(Event.QUEUE)
        future: asyncio.Future[Shed | None] = asyncio.get_running_loop().create_future()
        assert life.shell is not None
        life.shell.queued = future
        self.metrics.queue_depth.set(len(self.queue))
        try:
            shed = await future
        except asyncio.CancelledError:
            # admitted just as the client left: its slot (`life.admitted`) goes back when
            # its lifetime closes
            self.queue.remove(life)
            self.metrics.queue_depth.set(len(self.queue))
            raise
        finally:
            if life.shell is not None:
                life.shell.queued = None
        if shed is not None:
            raise refusal(shed)

    def pump(self) -> None:
        """A request finished: free its slot and let the next waiters in."""
        self.slots.give_back()
        self.dispatch()

    def dispatch(self) -> None:
        """Admit queued requests while there is room; shed those past their deadline."""
        if not len(self.queue):
            return  # the depth gauge was set when the queue last changed
        now, total = self.clock(), self.total_slots()  # no backend changes state in here
        lowest_is_top = len(self.priorities) == 1
        while len(self.queue) and self.slots.has_room(total, top_class=True):
            # only reserved room left: only the most important class may take it
            top_only = not self.slots.has_room(total, top_class=lowest_is_top)
            item, expired = self.queue.pop_ready(now, 0 if top_only else None)
            for shed in expired:
                self.metrics.shed.labels(shed.reason).inc()
                self._resolve(shed.item, shed)
            if item is None:
                break
            self._take_slot(item)
            self._resolve(item, None)
        self.metrics.queue_depth.set(len(self.queue))

    def expire(self) -> None:
        """Shed queued requests whose deadline passed (called on the router's tick)."""
        for shed in self.queue.expire(self.clock()):
            self.metrics.shed.labels(shed.reason).inc()
            self._resolve(shed.item, shed)
        self.metrics.queue_depth.set(len(self.queue))

    def _take_slot(self, life: RequestLifetime[RequestState]) -> None:
        self.slots.take()
        life.admitted = True

    @staticmethod
    def _resolve(life: RequestLifetime[RequestState], shed: Shed | None) -> None:
        future = None if life.shell is None else life.shell.queued
        if future is not None and not future.done():
            future.set_result(shed)
