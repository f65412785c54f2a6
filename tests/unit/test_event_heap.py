"""The simulators' one event loop: arrivals and heap events in time order (an event at an
arrival's time first, ties in push order), an engine's superseded events dropped, and each
event told whether arrivals remain."""

from __future__ import annotations

from gpuroute.sim.events import EventHeap

TICK = -1


def test_events_and_arrivals_interleave_in_time_and_superseded_engine_events_drop() -> None:
    heap = EventHeap(engines=2)
    heap.push(1.0, TICK, 7)
    heap.reschedule(0, 2.0)
    heap.reschedule(0, 3.0)  # supersedes engine 0's event at 2.0
    heap.reschedule(1, 1.0)
    heap.reschedule(1, None)  # engine 1 has nothing due after all
    seen: list[tuple] = []

    def on_event(t: float, kind: int, payload: int, arrivals_left: bool) -> None:
        seen.append(("event", t, kind, payload, arrivals_left))
        if kind == TICK and t < 4.0:
            heap.push(t + 2.5, TICK, 8)  # an event may push more

    heap.run([1.0, 3.0], lambda i, t: seen.append(("arrival", i, t)), on_event)
    assert seen == [
        ("event", 1.0, TICK, 7, True),  # at an arrival's time the event goes first
        ("arrival", 0, 1.0),
        ("event", 3.0, 0, 0, True),  # engine 0's latest event; its payload is 0
        ("arrival", 1, 3.0),
        ("event", 3.5, TICK, 8, False),
        ("event", 6.0, TICK, 8, False),
    ]
    assert not heap


def test_no_arrivals_and_no_events_end_at_once() -> None:
    heap = EventHeap(engines=0)
    heap.run([], lambda i, t: None, lambda *event: None)
    assert not heap
