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

    def run(
        self,
        arrivals: Sequence[float],
        on_arrival: Callable[[int, float], None],
        on_event: Callable[[float, int, int, bool], None],
    ) -> None:
        """Interleave sorted arrivals with the heap's events (an event at an arrival's time
        goes first) until both are exhausted. An event goes to `on_event` as (time, kind,
        payload, whether arrivals remain); an engine's event has kind = its index and
        payload 0, and is dropped when a later reschedule superseded it. The loop runs once
        per event of a million-request run, so it keeps the heap's list, the versions and
        heappop in locals."""
        items, versions, heappop = self._heap, self._versions, heapq.heappop
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
