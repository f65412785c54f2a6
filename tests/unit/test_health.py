"""Breakers and ejection applied to backend states, as the scheduler sees them."""

from __future__ import annotations

import random

from gpuroute.router.core import BackendSet, BackendState, RequestInfo, Scheduler
from gpuroute.router.core.breaker import BreakerSettings
from gpuroute.router.core.health import CHECK_DOWN, CHECK_OK, CHECK_SLOW, BackendHealth
from gpuroute.router.core.outlier import OutlierSettings
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.scheduler import Outcome
from gpuroute.router.core.slow_start import SlowStart
from support.helpers import backends, life


def make(n=4):
    pool = backends(n)
    backend_set = BackendSet(pool, slow_start=SlowStart(window_s=10))
    health = BackendHealth(
        backend_set,
        BreakerSettings(failure_threshold=3, cooldown_s=5, probes_to_close=2),
        OutlierSettings(consecutive_failures=50, base_ejection_s=30),
    )
    return pool, backend_set, Scheduler(backend_set, LeastOutstandingWork(), health=health)


def test_open_breaker_ejects_then_half_open_warms_then_closes() -> None:
    pool, backend_set, scheduler = make()
    bad = pool[0]
    for t in range(3):
        scheduler.health.record(bad, False, float(t))
    assert bad.state is BackendState.EJECTED and bad.reason == "breaker open"
    assert bad not in backend_set.routable("m")
    scheduler.tick(7.0)  # cooldown over: half-open, back in rotation but warming
    assert bad.state is BackendState.WARMING and bad in backend_set.routable("m")
    scheduler.health.record(bad, True, 7.5)
    scheduler.health.record(bad, True, 8.0)
    assert scheduler.health.breaker(bad.backend_id).state.value == "closed"
    scheduler.tick(17.0)
    assert bad.state is BackendState.READY


def test_failed_requests_through_the_scheduler_eject_and_routing_avoids_it() -> None:
    pool, _, scheduler = make()
    rng = random.Random(0)
    for i in range(3):
        request = life(RequestInfo(i, "m", 10, 10), tried=["b1", "b2", "b3"])
        decision = scheduler.route(request, 0.0, rng)
        scheduler.finish(request, Outcome(False), 0.0)
    assert pool[0].state is BackendState.EJECTED and decision.backend is pool[0]
    picks = {
        scheduler.route(life(RequestInfo(10 + i, "m", 10, 10)), 1.0, rng).backend.backend_id
        for i in range(30)
    }
    assert "b0" not in picks


def test_draining_backend_is_not_ejected_by_failures() -> None:
    pool, backend_set, scheduler = make()
    backend_set.set_state(pool[1], BackendState.DRAINING, 0.0, "drain")
    for t in range(5):
        scheduler.health.record(pool[1], False, float(t))
    assert pool[1].state is BackendState.DRAINING


def test_half_open_backend_gets_one_probe_at_a_time_whatever_the_policy_says() -> None:
    pool, _, scheduler = make()
    bad = pool[0]
    for t in range(3):
        scheduler.health.record(bad, False, float(t))
    scheduler.tick(7.0)
    rng = random.Random(1)
    probing = life(RequestInfo("p1", "m", 10, 10))
    probe = scheduler.route(probing, 7.1, rng)
    assert probe.backend is bad  # LOW alone would never pick a warming backend here
    others = [scheduler.route(life(RequestInfo(f"r{i}", "m", 10, 10)), 7.2, rng) for i in range(20)]
    assert bad not in {d.backend for d in others}  # its probe is still in flight
    scheduler.finish(probing, Outcome(True), 7.3)
    assert scheduler.route(life(RequestInfo("p2", "m", 10, 10)), 7.4, rng).backend is bad


def test_with_active_probes_a_half_open_backend_gets_no_client_request() -> None:
    pool = backends(3)
    backend_set = BackendSet(pool, slow_start=SlowStart(window_s=10))
    health = BackendHealth(
        backend_set, BreakerSettings(failure_threshold=1, cooldown_s=5), active_probes=True
    )
    scheduler = Scheduler(backend_set, LeastOutstandingWork(), health=health)
    health.record(pool[0], False, 0.0)
    scheduler.tick(6.0)
    assert health.half_open == {"b0"}
    rng = random.Random(2)
    picks = {
        scheduler.route(life(RequestInfo(i, "m", 10, 10)), 6.1, rng).backend.backend_id
        for i in range(50)
    }
    assert "b0" not in picks
    for t in (6.2, 6.3, 6.4):  # health checks succeed
        health.record(pool[0], True, t)
    assert health.half_open == set() and pool[0].state is BackendState.WARMING


def test_a_backend_vouched_for_is_probed_now_not_after_its_doubled_cooldown() -> None:
    """An engine restarted after its probes met it down: its cooldown has doubled (5, then
    10 s), but its agent's check passing again (Consul) half-opens the breaker at once."""
    pool, _, scheduler = make()
    bad, health = pool[0], scheduler.health
    for t in range(3):
        health.record(bad, False, float(t))  # opened at 2.0
    scheduler.tick(7.0)  # half-open
    health.record(bad, False, 7.1)  # the probe meets it still down: open, 10 s cooldown
    breaker = health.breaker(bad.backend_id)
    assert breaker.state.value == "open" and breaker.cooldown_s == 10
    scheduler.tick(9.0)
    assert bad.state is BackendState.EJECTED  # the cooldown alone would wait until 17.1
    events = health.vouched(bad, 9.0)
    assert [(b, t.after.value) for b, t in events.breaker] == [(bad.backend_id, "half_open")]
    assert bad.backend_id in health.half_open and bad.state is BackendState.WARMING
    health.record(bad, True, 9.1)
    health.record(bad, True, 9.2)
    assert breaker.state.value == "closed" and breaker.cooldown_s == 5


def test_vouching_for_a_closed_or_half_open_breaker_changes_nothing() -> None:
    pool, _, scheduler = make()
    health = scheduler.health
    assert not health.vouched(pool[1], 1.0).breaker
    for t in range(3):
        health.record(pool[0], False, float(t))
    scheduler.tick(7.0)
    assert not health.vouched(pool[0], 7.5).breaker
    assert health.breaker(pool[0].backend_id).state.value == "half_open"


def test_failed_checks_in_a_row_trip_the_breaker_and_a_pass_starts_the_way_back() -> None:
    pool, _backend_set, scheduler = make()
    health, dead = scheduler.health, pool[0]
    health.checked(dead, CHECK_DOWN, 0.0, failures_out=3)
    health.checked(dead, CHECK_OK, 0.5, failures_out=3)  # a pass resets the run
    health.checked(dead, CHECK_DOWN, 1.0, failures_out=3)
    events = health.checked(dead, CHECK_DOWN, 1.5, failures_out=3)
    assert dead.state is BackendState.READY and events.breaker == []
    events = health.checked(dead, CHECK_DOWN, 2.0, failures_out=3)  # the third in a row
    assert dead.state is BackendState.EJECTED and dead.reason == "breaker open"
    assert [t.after.value for _, t in events.breaker] == ["open"]
    health.checked(dead, CHECK_DOWN, 2.5, failures_out=3)  # open: more failures change nothing
    assert health.breaker(dead.backend_id).state.value == "open"
    # the first pass ends the cooldown (5 s) at once; the half-open probes close it
    events = health.checked(dead, CHECK_OK, 3.0, failures_out=3)
    assert [t.after.value for _, t in events.breaker] == ["half_open"]
    assert dead.state is BackendState.WARMING and dead.backend_id in health.half_open
    health.record(dead, True, 3.2)
    health.record(dead, True, 3.4)
    assert health.breaker(dead.backend_id).state.value == "closed"


def test_a_pass_leaves_a_breaker_that_requests_tripped_to_its_own_cooldown() -> None:
    """An engine can answer /health and fail every request: its breaker's cooldown (and
    its doubling) stands, the checks passing or not."""
    pool, _backend_set, scheduler = make()
    health, failing = scheduler.health, pool[1]
    for t in range(3):
        health.record(failing, False, float(t))
    assert health.breaker(failing.backend_id).state.value == "open"
    events = health.checked(failing, CHECK_OK, 3.0, failures_out=3)
    assert events.breaker == [] and failing.state is BackendState.EJECTED
    # and checks count nowhere in the outlier statistics
    assert not health.outliers.is_ejected(failing.backend_id)


def test_slow_checks_take_no_model_s_last_backend_out_but_a_dead_one_goes() -> None:
    """An engine swamped by a burst answers /health late: out only while its models keep
    another backend in rotation; refused connections take even the last one out."""
    pool, _backend_set, scheduler = make(2)
    health, first, second = scheduler.health, pool[0], pool[1]
    for t in range(3):
        health.checked(first, CHECK_SLOW, float(t), failures_out=3)
    assert first.state is BackendState.EJECTED  # the other serves its model
    for t in range(3, 6):
        health.checked(second, CHECK_SLOW, float(t), failures_out=3)
    assert second.state is BackendState.READY  # the model's last backend in rotation
    health.checked(second, CHECK_DOWN, 6.0, failures_out=3)  # nothing listens: out anyway
    assert second.state is BackendState.EJECTED
