"""The one event heap both simulators run on (regional and multi-region).

Events are (time, kind, payload); ties go to the earlier push. Engines' events are versioned:
rescheduling an engine supersedes its pending event, which is then dropped when popped."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence


class EventHeap:
    def __init__(self, engines: int) -> None:
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._versions = [0] * engines

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, t: float, kind: int, payload: int = 0) -> None:
        """A non-engine event: `kind` < 0 (each simulator names its own)."""
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def reschedule(self, engine: int, t_next: float | None) -> None:
        """Replace `engine`'s pending event with one at `t_next` (None: it has nothing due)."""
        self._versions[engine] += 1
        if t_next is not None:
            self._seq += 1
            heapq.heappush(self._heap, (t_next, self._seq, engine, self._versions[engine]))

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop(self) -> tuple[float, int, int] | None:
        """The next event as (time, kind, payload), or None for a superseded engine event;
        an engine's event has kind = its index."""
        t, _, kind, payload = heapq.heappop(self._heap)
        if kind >= 0:
            if payload != self._versions[kind]:
                return None
            payload = 0
        return t, kind, payload


def run_events(
    heap: EventHeap,
    arrivals: Sequence[float],
    on_arrival: Callable[[int, float], None],
    on_event: Callable[[float, int, int, bool], None],
) -> None:
    """Interleave sorted arrivals with the heap (an event at an arrival's time goes first)
    until both are exhausted; `on_event` is told whether arrivals remain. The loop runs
    once per event of a million-request run, so it reads the heap's list and versions
    itself (what `next_time` and `pop` do) rather than through three calls an event."""
    items, versions, heappop = heap._heap, heap._versions, heapq.heappop
    i, n = 0, len(arrivals)
    while True:
        t_arrival = arrivals[i] if i < n else math.inf
        if items and items[0][0] <= t_arrival:
            t, _, kind, payload = heappop(items)
            if kind >= 0:
                if payload != versions[kind]:
                    continue  # superseded by the engine's later reschedule
                payload = 0
            on_event(t, kind, payload, i < n)
        elif i < n:
            on_arrival(i, t_arrival)
            i += 1
        else:
            return
