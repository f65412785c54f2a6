"""SLO-aware admission (sans-IO): requests that no backend is predicted to serve within
their SLO wait here, by class, while their TTFT budget lasts; then they are refused.

Sending a request that is predicted to miss helps nobody: it misses, and its prefill
lengthens every stream already running there. Holding it a little costs only its own
budget: when a finishing stream frees room, the most important class goes first (then
first come, first served), so batch work never takes room an interactive request is waiting
for. A request whose TTFT budget is gone is refused (429 with Retry-After naming its class)
instead of being sent to miss; one that cannot even be held (the queue is at its limit with
nothing less important to displace) is refused at once, in microseconds rather than after a
minute in an engine's queue."""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass

from gpuroute.router.core.slo import SloClass, SloClasses


@dataclass(frozen=True, slots=True)
class Refusal:
    item: Hashable
    slo_class: str
    reason: str  # "slo_deadline" | "slo_queue_full" | "slo_displaced"
    retry_after_s: int


# Held requests offered room each time some may have freed (a stream ended, a first token
# came): a bounded number, most important first, so one event costs a few routing decisions
# however long the queue (the live router and the simulator use the same bound).
OFFERS_PER_EVENT = 8


class HoldQueue:
    """Held requests per class rank (0 = most important), each with its deadline: the end
    of its TTFT budget, after which it can no longer meet its class."""

    def __init__(
        self, classes: SloClasses, max_held: int = 1024, max_retry_after_s: int = 60
    ) -> None:
        if max_held < 0:
            raise ValueError("max_held must be >= 0")
        self.classes = classes
        self.max_held = max_held
        self.max_retry_after_s = max_retry_after_s
        # rank -> {item: (deadline, class name)}; dicts keep insertion (FIFO) order
        self._held: dict[int, dict[Hashable, tuple[float, str]]] = {}
        self._count = 0
        self._released = 0.0  # dispatches per second, EWMA (for Retry-After)
        self._last_release: float | None = None

    def __len__(self) -> int:
        return self._count

    def __contains__(self, item: Hashable) -> bool:
        return any(item in held for held in self._held.values())

    def retry_after(self) -> int:
        if self._released <= 0:
            return 1
        return max(1, min(self.max_retry_after_s, math.ceil((self._count + 1) / self._released)))

    def hold(self, item: Hashable, slo: SloClass, arrived_at: float, now: float) -> list[Refusal]:
        """Hold `item` (of class `slo`, its TTFT clock started at `arrived_at`) while its
        TTFT budget lasts; returns who is refused for it: the newcomer itself (budget gone,
        or the queue full of equal or more important work) or the newest held request of
        the least important class below it."""
        rank, slo_class = self.classes.rank[slo.name], slo.name
        deadline = arrived_at + slo.ttft_s
        if deadline <= now:
            return [Refusal(item, slo_class, "slo_deadline", self.retry_after())]
        refused: list[Refusal] = []
        if self._count >= self.max_held:
            lowest = max((r for r, held in self._held.items() if held), default=None)
            if lowest is None or lowest <= rank:
                return [Refusal(item, slo_class, "slo_queue_full", self.retry_after())]
            victim = next(reversed(self._held[lowest]))
            _, victim_class = self._held[lowest].pop(victim)
            self._count -= 1
            refused.append(Refusal(victim, victim_class, "slo_displaced", self.retry_after()))
        self._held.setdefault(rank, {})[item] = (deadline, slo_class)
        self._count += 1
        return refused

    def waiting(self, limit: int | None = None) -> list[Hashable]:
        """Up to `limit` held items, most important class first, oldest first (a list: the
        caller may release or remove while going through it)."""
        items: list[Hashable] = []
        for rank in sorted(self._held):
            items.extend(
                itertools.islice(self._held[rank], None if limit is None else limit - len(items))
            )
            if limit is not None and len(items) >= limit:
                break
        return items

    def deadline(self, item: Hashable) -> float | None:
        """When a held item's TTFT budget runs out (None: not held)."""
        for held in self._held.values():
            if item in held:
                return held[item][0]
        return None

    def release(self, item: Hashable, now: float) -> bool:
        """The item got room and goes now."""
        if not self.remove(item):
            return False
        if self._last_release is not None:
            gap = max(now - self._last_release, 1e-6)
            self._released += 0.1 * (1.0 / gap - self._released)
        self._last_release = now
        return True

    def remove(self, item: Hashable) -> bool:
        """Withdraw a held item (its client went away)."""
        for held in self._held.values():
            if held.pop(item, None) is not None:
                self._count -= 1
                return True
        return False

    def expire(self, now: float) -> list[Refusal]:
        """Refuse every held item whose deadline has passed."""
        refused = []
        for held in self._held.values():
            late = [item for item, (deadline, _) in held.items() if deadline <= now]
            for item in late:
                _, slo_class = held.pop(item)
                refused.append(Refusal(item, slo_class, "slo_deadline", self.retry_after()))
        self._count -= len(refused)
        return refused


class MarginController:
    """Keeps the requests it admits meeting their SLO by adjusting the prediction margin.

    Predictions err, and at overload they err towards optimism (what is admitted after a
    request adds prefill interference to it). Each finished request's verdict nudges the
    margin (a stochastic approximation to a met-rate of `target`): a miss tightens it by
    `step` x target, a hit loosens it by `step` x (1 - target). At equilibrium `target` of
    admitted requests meet their SLO, whatever the fleet, trace or predictor's bias."""

    __slots__ = ("high", "low", "margin", "step", "target")

    def __init__(
        self,
        margin: float = 0.9,
        *,
        target: float = 0.95,
        step: float = 0.01,
        low: float = 0.3,
        high: float = 1.0,
    ) -> None:
        if not 0 < low <= margin <= high or not 0 < target < 1 or step <= 0:
            raise ValueError("need 0 < low <= margin <= high, target in (0, 1), step > 0")
        self.margin, self.target, self.step = margin, target, step
        self.low, self.high = low, high

    def observe(self, met: bool) -> float:
        self.margin += self.step * ((1.0 if met else 0.0) - self.target)
        self.margin = min(max(self.margin, self.low), self.high)
        return self.margin
