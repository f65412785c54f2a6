"""Admission control: priority classes, per-request deadlines, a bounded queue, shedding,
and (`Admission`) the in-flight slots over the routable backends, the share reserved to the
most important class and the warm standby brought in before a request would wait: every
admission decision, run alike by the live router (router/front/admission.py parks and wakes
its waiters) and the simulator.

AdmissionQueue items are anything hashable and unique while queued (a request id, or the
request object); Admission's are request lifetimes.

Pure: the caller says what time it is and applies the verdicts.
A full queue sheds the lowest-priority, newest entry (possibly the newcomer) with a
Retry-After hint from the measured drain rate.

Within a priority class, tenants are served fairly (start-time fair queuing): each queued
item gets a virtual start one past its tenant's previous one, but never below the virtual
time of the last dispatch, so one tenant's burst queues behind itself and a quiet tenant's
request goes ahead of the burst's tail instead of waiting for all of it."""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuroute.router.core.backend import ROUTABLE_STATES, BackendSet
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.standby import StandbyRotation


class Verdict(enum.Enum):
    ADMIT = "admit"
    QUEUED = "queued"
    SHED = "shed"


@dataclass(frozen=True, slots=True)
class Shed:
    item: Hashable
    reason: str  # "queue_full" | "deadline" | "displaced"
    retry_after_s: int
    priority: str = ""  # the class it was offered or queued in


@dataclass(frozen=True, slots=True)
class Offer:
    verdict: Verdict
    shed: tuple[Shed, ...] = ()  # the newcomer and/or a displaced lower-priority entry


ADMITTED = Offer(Verdict.ADMIT)  # the common answer, made once


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    priorities: tuple[str, ...] = ("high", "normal", "low")  # most important first
    max_queue: int = 1024
    default_timeout_s: float = 30.0
    min_retry_after_s: int = 1
    max_retry_after_s: int = 60

    def __post_init__(self) -> None:
        if not self.priorities or len(set(self.priorities)) != len(self.priorities):
            raise ValueError("priorities must be a non-empty list of distinct names")
        if self.max_queue < 0 or self.default_timeout_s <= 0:
            raise ValueError("max_queue must be >= 0 and default_timeout_s > 0")


class AdmissionQueue:
    def __init__(self, settings: AdmissionSettings | None = None) -> None:
        self.settings = settings or AdmissionSettings()
        self._rank = {name: i for i, name in enumerate(self.settings.priorities)}
        # (rank, virtual start, seq, deadline, item)
        self._heap: list[tuple[int, float, int, float, object]] = []
        self._vtime = 0.0  # virtual start of the last dispatched item
        self._tenant_vtime: dict[object, float] = {}
        self._cancelled: set[int] = set()
        self._seq = itertools.count()
        # item -> (rank, seq, deadline): to cancel it, and to say when it runs out
        self._seq_of: dict[Hashable, tuple[int, int, float]] = {}
        self._waiting = [0] * len(self.settings.priorities)  # live entries per rank
        self._drain_rate = 0.0  # dispatches per second, EWMA
        self._last_dispatch: float | None = None

    def __len__(self) -> int:
        return sum(self._waiting)

    def __contains__(self, item: Hashable) -> bool:
        return item in self._seq_of

    def rank(self, priority: str) -> int:
        try:
            return self._rank[priority]
        except KeyError:
            raise ValueError(
                f"unknown priority {priority!r}; known: {', '.join(self.settings.priorities)}"
            ) from None

    def retry_after(self) -> int:
        s = self.settings
        if self._drain_rate <= 0:
            return s.min_retry_after_s
        wait = math.ceil((len(self) + 1) / self._drain_rate)
        return max(s.min_retry_after_s, min(s.max_retry_after_s, wait))

    def offer(
        self,
        item: Hashable,
        priority: str,
        now: float,
        *,
        has_capacity: bool,
        deadline: float | None = None,
        tenant: object = None,
    ) -> Offer:
        rank = self.rank(priority)
        if has_capacity and not any(self._waiting[: rank + 1]):
            return ADMITTED  # nobody of equal or higher priority is waiting
        if deadline is None:
            deadline = now + self.settings.default_timeout_s
        if deadline <= now:
            return Offer(Verdict.SHED, (self._shed(item, "deadline", rank),))
        displaced: tuple[Shed, ...] = ()
        if len(self) >= self.settings.max_queue:
            victim = self._lowest()
            if victim is None or victim[0] <= rank:
                return Offer(Verdict.SHED, (self._shed(item, "queue_full", rank),))
            self.remove(victim[4])
            displaced = (self._shed(victim[4], "displaced", victim[0]),)
        seq = next(self._seq)
        start = max(self._vtime, self._tenant_vtime.get(tenant, 0.0)) + 1.0
        self._tenant_vtime[tenant] = start
        heapq.heappush(self._heap, (rank, start, seq, deadline, item))
        self._seq_of[item] = (rank, seq, deadline)
        self._waiting[rank] += 1
        return Offer(Verdict.QUEUED, displaced)

    def pop_ready(
        self, now: float, max_rank: int | None = None
    ) -> tuple[object | None, list[Shed]]:
        """Next item to dispatch (highest priority, then fairest) and those whose deadline
        passed. With `max_rank`, only items of that priority rank or more important go."""
        expired = []
        while self._heap:
            if max_rank is not None and self._heap[0][0] > max_rank:
                break
            rank, start, seq, deadline, item = heapq.heappop(self._heap)
            if seq in self._cancelled:
                self._cancelled.discard(seq)
                continue
            self._seq_of.pop(item, None)
            self._waiting[rank] -= 1
            if deadline <= now:
                expired.append(self._shed(item, "deadline", rank))
                continue
            self._note_dispatch(now)
            self._vtime = max(self._vtime, start)
            return item, expired
        return None, expired

    def peek(self, limit: int | None = None) -> list[Hashable]:
        """The first `limit` queued items in dispatch order (most important class, then
        fairest), all of them without a limit; nothing is removed."""
        live = self._live()
        entries = sorted(live) if limit is None else heapq.nsmallest(limit, live)
        return [entry[4] for entry in entries]

    def take(self, item: Hashable, now: float) -> bool:
        """Dispatch a queued item out of turn (it found room before those ahead of it did:
        SLO-aware admission); False if it was not queued."""
        if not self.remove(item):
            return False
        self._note_dispatch(now)
        return True

    def deadline(self, item: Hashable) -> float | None:
        """When a queued item runs out of time (None: not queued)."""
        entry = self._seq_of.get(item)
        return None if entry is None else entry[2]

    def remove(self, item: Hashable) -> bool:
        """Withdraw a queued item (client went away). False if it was not queued."""
        entry = self._seq_of.pop(item, None)
        if entry is None:
            return False
        rank, seq, _ = entry
        self._cancelled.add(seq)
        self._waiting[rank] -= 1
        if len(self._cancelled) > 64 and 2 * len(self._cancelled) > len(self._heap):
            # withdrawn entries stay in the heap until popped; a queue whose items mostly
            # leave out of turn (taken or withdrawn) would otherwise only grow
            self._heap = [e for e in self._heap if e[2] not in self._cancelled]
            heapq.heapify(self._heap)
            self._cancelled.clear()
        return True

    def expire(self, now: float) -> list[Shed]:
        """Withdraw every queued item whose deadline has passed (in queue order)."""
        expired = sorted((e for e in self._live() if e[3] <= now), key=lambda e: e[2])
        for entry in expired:
            self.remove(entry[4])
        return [self._shed(e[4], "deadline", e[0]) for e in expired]

    def _shed(self, item: Hashable, reason: str, rank: int) -> Shed:
        return Shed(item, reason, self.retry_after(), self.settings.priorities[rank])

    def _live(self):
        return (entry for entry in self._heap if entry[2] not in self._cancelled)

    def _lowest(self) -> tuple[int, float, int, float, object] | None:
        return max(self._live(), key=lambda e: (e[0], e[2]), default=None)

    def _note_dispatch(self, now: float) -> None:
        if self._last_dispatch is not None:
            gap = max(now - self._last_dispatch, 1e-6)
            self._drain_rate += 0.1 * (1.0 / gap - self._drain_rate)
        self._last_dispatch = now


class AdmissionSlots:
    """In-flight slots over the routable backends, counted as requests are admitted and
    finish. Every class but the most important leaves `reserved_top_fraction` to it."""

    __slots__ = ("admitted", "reserved_top_fraction")

    def __init__(self, reserved_top_fraction: float = 0.0) -> None:
        if not 0 <= reserved_top_fraction < 1:
            raise ValueError("reserved_top_fraction must be in [0, 1)")
        self.reserved_top_fraction = reserved_top_fraction
        self.admitted = 0  # admitted and not yet finished

    def has_room(self, total_slots: int, top_class: bool) -> bool:
        usable = total_slots if top_class else int(total_slots * (1.0 - self.reserved_top_fraction))
        return self.admitted < usable

    def take(self) -> None:
        self.admitted += 1

    def give_back(self) -> None:
        self.admitted -= 1


class Admission:
    """Whether a request may go now, wait, or is shed: each backend's own in-flight limit
    adds up to the slots, a class below the most important leaves `reserved_top_fraction`
    of them, a warm standby backend of the request's model comes in (its slots with it)
    before a request would wait, and waiters go in the queue's order as slots free.

    `limits` None: no backend limits what it takes (every request is admitted at once and
    nobody ever waits); the simulator's default. A lifetime holding a slot says so
    (`life.admitted`) until `release`."""

    def __init__(
        self,
        settings: AdmissionSettings,
        backends: BackendSet,
        limits: Mapping[str, int] | None = None,
        *,
        reserved_top_fraction: float = 0.0,
        standby: StandbyRotation | None = None,
    ) -> None:
        self.queue = AdmissionQueue(settings)
        self.priorities = settings.priorities
        self.slots = AdmissionSlots(reserved_top_fraction)
        self.backends = backends
        self.standby = standby  # warm backends brought in before a request would wait
        self.limited = limits is not None
        self._limits = dict(limits or {})
        self._total_at = -1  # the backend set's version `_total` was counted at
        self._total = 0

    def has_room(self, backend_id: str) -> bool:
        """Is this backend below its own in-flight limit? (A session's remembered backend is
        kept only while it is.)"""
        if not self.limited:
            return True
        return self.backends.get(backend_id).in_flight < self._limits.get(backend_id, 0)

    def set_limit(self, backend_id: str, max_inflight: int | None) -> None:
        """A backend's in-flight limit (None: it left)."""
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
        if not self.limited:
            return True
        top = priority is None or priority == self.priorities[0]
        return self.slots.has_room(self.total_slots(), top)

    def offer(self, life: RequestLifetime, now: float, deadline: float | None = None) -> Offer:
        """A request arrives: ADMIT (it holds a slot), QUEUED, or shed (`Offer.shed` may
        also hold a lower-priority waiter it displaced)."""
        if not self.limited:  # nothing limits what a backend takes: nobody ever waits
            self._take_slot(life)
            return ADMITTED
        info = life.info
        has_capacity = self.has_capacity(info.priority) or (
            self._brought_in(info.model, now) and self.has_capacity(info.priority)
        )
        offer = self.queue.offer(
            life, info.priority, now, has_capacity=has_capacity, deadline=deadline,
            tenant=info.tenant,
        )  # fmt: skip
        if offer.verdict is Verdict.ADMIT:
            self._take_slot(life)
        return offer

    def release(self) -> None:
        """An admitted request finished: its slot is free (`dispatch` lets waiters in)."""
        self.slots.give_back()

    def dispatch(self, now: float) -> list[tuple[Any, Shed | None]]:
        """Waiters let in while there is room (None: admitted, holding a slot) and those
        found past their deadline on the way (their Shed), in the order decided. Reserved
        room goes only to the most important class."""
        if not self.limited:  # `offer` admitted everyone at once: nobody waits
            return []
        decided: list[tuple[Any, Shed | None]] = []
        total = self.total_slots()  # no backend changes state here
        lowest_is_top = len(self.priorities) == 1
        while len(self.queue) and self.slots.has_room(total, True):
            top_only = not self.slots.has_room(total, lowest_is_top)
            item, expired = self.queue.pop_ready(now, 0 if top_only else None)
            decided += [(shed.item, shed) for shed in expired]
            if item is None:
                break
            self._take_slot(item)  # what `offer` queued: a lifetime
            decided.append((item, None))
        return decided

    def expire(self, now: float) -> list[Shed]:
        """Shed the waiters whose deadline passed."""
        return self.queue.expire(now)

    def withdraw(self, life: RequestLifetime) -> bool:
        """A waiter left (its client went away); False if it was not waiting."""
        return self.queue.remove(life)

    def _brought_in(self, model: str, now: float) -> bool:
        """A standby backend of `model` came into rotation (the slots are full)."""
        return self.standby is not None and self.standby.promote(model, now) is not None

    def _take_slot(self, life: Any) -> None:
        self.slots.take()
        life.admitted = True
