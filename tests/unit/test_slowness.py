"""Slowness: observed/expected durations against the fleet, from finished and running work."""

from __future__ import annotations

import random

import pytest
from gpuroute.router.core import BackendSet, RequestInfo, Scheduler
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.slowness import SlownessTracker
from support.helpers import backends


def finished(tracker: SlownessTracker, backend: str, took: float, expected: float = 1.0) -> float:
    """A request started at 0 on `backend` that finished at `took`: its ratio."""
    return tracker.finish(tracker.start(backend, 0.0, expected), took)


def test_finished_requests_set_each_backends_ratio_relative_to_the_median() -> None:
    tracker = SlownessTracker(alpha=1.0, min_samples=1)
    for backend, took in [("a", 1.0), ("b", 1.0), ("c", 4.0)]:
        finished(tracker, backend, took)
    assert tracker.refresh(5.0, ["a", "b", "c"]) == {"a": 1.0, "b": 1.0, "c": 4.0}


def test_a_prefill_queue_is_not_slowness_when_the_decode_is_measured() -> None:
    """Backend "q" takes the long prompts: its streams wait 3 s for their first token,
    then decode as fast as anyone's. Judged from the start it would be 4x slow; judged by
    its decode (`since` the first token, against the decode's expected time) it is not.
    A backend whose decode itself is slow still is."""
    tracker = SlownessTracker(alpha=1.0, min_samples=1)
    runs = [("a", 0.0, 1.0), ("b", 0.0, 1.0), ("q", 3.0, 1.0), ("s", 0.0, 4.0)]
    ratios = []
    for backend, first_token, decode in runs:
        timing = tracker.start(backend, 0.0, expected_s=1.0)
        ratios.append(
            tracker.finish(timing, first_token + decode, expected_s=1.0, since=first_token)
        )
    assert ratios == [1.0, 1.0, 1.0, 4.0]  # what outlier detection is given
    slowness = tracker.refresh(10.0, ["a", "b", "q", "s"])
    assert slowness["q"] == 1.0 and slowness["s"] == 4.0


def test_running_requests_reveal_a_backend_that_stopped_finishing() -> None:
    tracker = SlownessTracker(min_samples=3)
    for _ in range(3):  # healthy backends finish on time
        for b in ("a", "b"):
            finished(tracker, b, 1.0)
    # "c" has three requests (their lifetimes' timings) that should have taken 1 s, 10 s ago
    running = [tracker.start("c", 0.0, 1.0) for _ in range(3)]
    slowness = tracker.refresh(10.0, ["a", "b", "c"], running)
    assert slowness["a"] == slowness["b"] == 1.0
    assert slowness["c"] == pytest.approx(10.0)


def test_too_few_samples_or_forgotten_requests_change_nothing() -> None:
    tracker = SlownessTracker(min_samples=3)
    tracker.start("b", 0.0, 1.0)  # dropped: its attempt failed, nothing to learn
    finished(tracker, "a", 50.0)
    assert tracker.refresh(100.0, ["a", "b"]) == {}


def test_least_outstanding_work_moves_traffic_off_a_slow_backend() -> None:
    pool = backends(4)
    scheduler = Scheduler(BackendSet(pool), LeastOutstandingWork())
    pool[0].slowness = 20.0
    rng = random.Random(3)
    counts = dict.fromkeys((b.backend_id for b in pool), 0)
    for i in range(6000):  # nothing finishes: booked work piles up where requests go
        life = RequestLifetime(RequestInfo(i, "m", 100, 50))
        counts[scheduler.route(life, 0.0, rng).backend.backend_id] += 1
    # equal score = equal outstanding x slowness: b0 carries 1/20 of another's work
    assert counts["b0"] / 6000 == pytest.approx(1 / 61, abs=0.002)
    assert all(counts[f"b{i}"] / 6000 == pytest.approx(20 / 61, abs=0.002) for i in (1, 2, 3))


def test_in_a_pair_the_other_backend_is_the_yardstick() -> None:
    tracker = SlownessTracker(alpha=1.0, min_samples=1)
    finished(tracker, "a", 1.0)
    finished(tracker, "b", 20.0)
    assert tracker.refresh(30.0, ["a", "b"]) == {"a": 1.0, "b": 20.0}


def _healthy_past(tracker: SlownessTracker, *backend_ids: str) -> None:
    for b in backend_ids:
        for _ in range(3):
            finished(tracker, b, 1.0)


def test_a_slow_pace_outweighs_the_healthy_past_of_finished_requests() -> None:
    """Every backend finished its requests on time; then "c"'s streams run 10x slower for
    three windows. Its finished requests still say 1; its pace says 10."""
    tracker = SlownessTracker(min_samples=3)
    _healthy_past(tracker, "a", "b", "c")
    for window in range(3):
        now = 10.0 + 2 * window
        for b, pace in (("a", 3.0), ("b", 3.0), ("c", 30.0)):
            tracker.observe_pace(b, now, [pace * 0.9, pace, pace * 1.1])
        if window < 2:  # two windows are not yet a run
            assert tracker.refresh(now, ["a", "b", "c"])["c"] == 1.0
    assert tracker.refresh(14.0, ["a", "b", "c"]) == {"a": 1.0, "b": 1.0, "c": 10.0}
    # and it recovers as soon as its pace does, whatever its finished requests said
    for window in range(2):
        for b in ("a", "b", "c"):
            tracker.observe_pace(b, 16.0 + 2 * window, [3.0] * 3)
    assert tracker.refresh(18.0, ["a", "b", "c"])["c"] == 1.0


def test_one_window_that_met_a_long_prefill_does_not_count() -> None:
    tracker = SlownessTracker(min_samples=3)
    _healthy_past(tracker, "a", "b", "c")
    for window, c_pace in enumerate((3.0, 60.0, 3.0)):
        for b, pace in (("a", 3.0), ("b", 3.0), ("c", c_pace)):
            tracker.observe_pace(b, 10.0 + 2 * window, [pace] * 3)
    assert tracker.refresh(14.0, ["a", "b", "c"])["c"] == 1.0


def test_a_pace_needs_streams_company_and_freshness() -> None:
    """Fewer than `min_samples` streams break a backend's run of windows; a pace alone in
    the fleet has no yardstick; a pace older than `stall_s` is not used. In each case the
    finished requests decide (here: "c" finished 4x slow)."""
    tracker = SlownessTracker(min_samples=3, stall_s=5.0)
    _healthy_past(tracker, "a", "b")
    for _ in range(3):
        finished(tracker, "c", 4.0)
    ids = ["a", "b", "c"]
    for window in range(3):
        tracker.observe_pace("a", 10.0 + 2 * window, [3.0] * 3)
        tracker.observe_pace("c", 10.0 + 2 * window, [3.0] * 3 if window != 1 else [3.0] * 2)
    assert tracker.refresh(14.0, ids)["c"] == 4.0  # c's run was broken, a is alone
    for window in range(3):
        for b in ids:
            tracker.observe_pace(b, 16.0 + 2 * window, [3.0] * 3)
    assert tracker.refresh(20.0, ids)["c"] == 1.0  # paces agree: the pace decides
    assert tracker.refresh(25.1, ids)["c"] == 4.0  # stale again


def test_past_64_backends_each_is_judged_against_the_whole_fleets_median() -> None:
    """The yardstick of a large fleet is everyone's median ratio (sorted once a refresh)."""
    tracker = SlownessTracker(alpha=1.0, min_samples=1)
    ids = [f"b{i}" for i in range(100)]
    for i, backend in enumerate(ids):
        finished(tracker, backend, 1.0 + i / 100)  # ratios 1.00 .. 1.99, median 1.495
    finished(tracker, "b99", 30.0)  # one gray failure
    slowness = tracker.refresh(5.0, ids)
    assert slowness["b99"] == pytest.approx(30.0 / 1.495)
    assert all(slowness[b] == 1.0 for b in ids[:99])


def test_running_requests_are_read_only_once_a_backend_stopped_finishing() -> None:
    """A tick of a busy fleet does not walk every request in flight: their ages matter
    only for a backend that finished nothing for `stall_s`."""
    tracker = SlownessTracker(min_samples=1, stall_s=5.0)
    finished(tracker, "a", 1.0)
    finished(tracker, "b", 1.0)

    def never_read():
        raise AssertionError("the running requests were read")
        yield

    assert tracker.refresh(4.0, ["a", "b"], never_read()) == {"a": 1.0, "b": 1.0}
    running = [tracker.start("b", 0.0, 1.0)]
    assert tracker.refresh(7.0, ["a", "b"], iter(running))["b"] == pytest.approx(7.0)
