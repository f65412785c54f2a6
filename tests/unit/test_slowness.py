"""Slowness: observed/expected durations against the fleet, from finished and running work."""

from __future__ import annotations

import random

import pytest
from gpuroute.router.core import BackendSet, RequestInfo, Scheduler
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.slowness import SlownessTracker
from support.helpers import backends


def test_finished_requests_set_each_backends_ratio_relative_to_the_median() -> None:
    tracker = SlownessTracker(alpha=1.0, min_samples=1)
    for i, (backend, took) in enumerate([("a", 1.0), ("b", 1.0), ("c", 4.0)]):
        tracker.start(i, backend, 0.0, expected_s=1.0)
        tracker.finish(i, took)
    assert tracker.refresh(5.0, ["a", "b", "c"]) == {"a": 1.0, "b": 1.0, "c": 4.0}


def test_a_prefill_queue_is_not_slowness_when_the_decode_is_measured() -> None:
    """Backend "q" takes the long prompts: its streams wait 3 s for their first token,
    then decode as fast as anyone's. Judged from the start it would be 4x slow; judged by
    its decode (`since` the first token, against the decode's expected time) it is not.
    A backend whose decode itself is slow still is."""
    tracker = SlownessTracker(alpha=1.0, min_samples=1)
    runs = [("a", 0.0, 1.0), ("b", 0.0, 1.0), ("q", 3.0, 1.0), ("s", 0.0, 4.0)]
    ratios = []
    for i, (backend, first_token, decode) in enumerate(runs):
        tracker.start(i, backend, 0.0, expected_s=1.0)
        ratios.append(tracker.finish(i, first_token + decode, expected_s=1.0, since=first_token))
    assert ratios == [1.0, 1.0, 1.0, 4.0]  # what outlier detection is given
    assert tracker.finish("never-started", 1.0) is None
    slowness = tracker.refresh(10.0, ["a", "b", "q", "s"])
    assert slowness["q"] == 1.0 and slowness["s"] == 4.0


def test_running_requests_reveal_a_backend_that_stopped_finishing() -> None:
    tracker = SlownessTracker(min_samples=3)
    for i in range(3):  # healthy backends finish on time
        for b in ("a", "b"):
            tracker.start((b, i), b, 0.0, 1.0)
            tracker.finish((b, i), 1.0)
    for i in range(3):  # "c" has three requests that should have taken 1 s, 10 s ago
        tracker.start(("c", i), "c", 0.0, 1.0)
    slowness = tracker.refresh(10.0, ["a", "b", "c"])
    assert slowness["a"] == slowness["b"] == 1.0
    assert slowness["c"] == pytest.approx(10.0)


def test_too_few_samples_or_forgotten_requests_change_nothing() -> None:
    tracker = SlownessTracker(min_samples=3)
    tracker.start(1, "a", 0.0, 1.0)
    tracker.start(2, "b", 0.0, 1.0)
    tracker.forget(2)
    tracker.finish(1, 50.0)
    assert tracker.refresh(100.0, ["a", "b"]) == {}


def test_least_outstanding_work_moves_traffic_off_a_slow_backend() -> None:
    pool = backends(4)
    scheduler = Scheduler(BackendSet(pool), LeastOutstandingWork())
    pool[0].slowness = 20.0
    rng = random.Random(3)
    counts = dict.fromkeys((b.backend_id for b in pool), 0)
    for i in range(6000):  # nothing finishes: booked work piles up where requests go
        counts[scheduler.route(RequestInfo(i, "m", 100, 50), 0.0, rng).backend.backend_id] += 1
    # equal score = equal outstanding x slowness: b0 carries 1/20 of another's work
    assert counts["b0"] / 6000 == pytest.approx(1 / 61, abs=0.002)
    assert all(counts[f"b{i}"] / 6000 == pytest.approx(20 / 61, abs=0.002) for i in (1, 2, 3))


def test_in_a_pair_the_other_backend_is_the_yardstick() -> None:
    tracker = SlownessTracker(alpha=1.0, min_samples=1)
    tracker.start("a1", "a", 0.0, 1.0)
    tracker.finish("a1", 1.0)
    tracker.start("b1", "b", 0.0, 1.0)
    tracker.finish("b1", 20.0)
    assert tracker.refresh(30.0, ["a", "b"]) == {"a": 1.0, "b": 20.0}
