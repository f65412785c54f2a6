"""Admission control: priority classes, per-request deadlines, a bounded queue, shedding.

Items are anything hashable and unique while queued (a request id, or the request object).

Pure: the caller says whether the pool has room (`has_capacity`) and applies the verdicts.
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
from collections.abc import Hashable
from dataclasses import dataclass


class Verdict(enum.Enum):
    ADMIT = "admit"
    QUEUED = "queued"
    SHED = "shed"


@dataclass(frozen=True, slots=True)
class Shed:
    item: Hashable
    reason: str  # "queue_full" | "deadline" | "displaced"
    retry_after_s: int


@dataclass(frozen=True, slots=True)
class Offer:
    verdict: Verdict
    shed: tuple[Shed, ...] = ()  # the newcomer and/or a displaced lower-priority entry


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
        self._seq_of: dict[Hashable, tuple[int, int]] = {}  # item -> (rank, seq), to cancel
        self._waiting = [0] * len(self.settings.priorities)  # live entries per rank
        self._drain_rate = 0.0  # dispatches per second, EWMA
        self._last_dispatch: float | None = None

    def __len__(self) -> int:
        return sum(self._waiting)

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
            return Offer(Verdict.ADMIT)  # nobody of equal or higher priority is waiting
        if deadline is None:
            deadline = now + self.settings.default_timeout_s
        if deadline <= now:
            return Offer(Verdict.SHED, (Shed(item, "deadline", self.retry_after()),))
        displaced: tuple[Shed, ...] = ()
        if len(self) >= self.settings.max_queue:
            victim = self._lowest()
            if victim is None or victim[0] <= rank:
                return Offer(Verdict.SHED, (Shed(item, "queue_full", self.retry_after()),))
            self._cancel(victim)
            displaced = (Shed(victim[4], "displaced", self.retry_after()),)
        seq = next(self._seq)
        start = max(self._vtime, self._tenant_vtime.get(tenant, 0.0)) + 1.0
        self._tenant_vtime[tenant] = start
        heapq.heappush(self._heap, (rank, start, seq, deadline, item))
        self._seq_of[item] = (rank, seq)
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
                expired.append(Shed(item, "deadline", self.retry_after()))
                continue
            self._note_dispatch(now)
            self._vtime = max(self._vtime, start)
            return item, expired
        return None, expired

    def remove(self, item: Hashable) -> bool:
        """Withdraw a queued item (client went away). False if it was not queued."""
        entry = self._seq_of.pop(item, None)
        if entry is None:
            return False
        rank, seq = entry
        self._cancelled.add(seq)
        self._waiting[rank] -= 1
        return True

    def expire(self, now: float) -> list[Shed]:
        """Withdraw every queued item whose deadline has passed (in queue order)."""
        expired = sorted((e for e in self._live() if e[3] <= now), key=lambda e: e[2])
        for entry in expired:
            self._cancel(entry)
        return [Shed(e[4], "deadline", self.retry_after()) for e in expired]

    def _live(self):
        return (entry for entry in self._heap if entry[2] not in self._cancelled)

    def _lowest(self) -> tuple[int, float, int, float, object] | None:
        return max(self._live(), key=lambda e: (e[0], e[2]), default=None)

    def _cancel(self, entry: tuple[int, float, int, float, object]) -> None:
        self._cancelled.add(entry[2])
        self._seq_of.pop(entry[4], None)
        self._waiting[entry[0]] -= 1

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
