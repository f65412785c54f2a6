from __future__ import annotations

import pytest
from gpuroute.router.core.breaker import (
    TRANSITIONS,
    BreakerEvent,
    BreakerSettings,
    BreakerState,
    CircuitBreaker,
    IllegalTransition,
    next_state,
)
from hypothesis import given
from hypothesis import strategies as st

S, E = BreakerState, BreakerEvent


def test_transition_table_is_exactly_this() -> None:
    legal = {(s, e): t for s, row in TRANSITIONS.items() for e, t in row.items()}
    assert legal == {
        (S.CLOSED, E.TRIP): S.OPEN,
        (S.OPEN, E.COOLDOWN_ELAPSED): S.HALF_OPEN,
        (S.HALF_OPEN, E.PROBE_SUCCEEDED): S.CLOSED,
        (S.HALF_OPEN, E.PROBE_FAILED): S.OPEN,
    }


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("event", list(E))
def test_illegal_events_raise(state, event) -> None:
    if event in TRANSITIONS[state]:
        assert next_state(state, event) is TRANSITIONS[state][event]
    else:
        with pytest.raises(IllegalTransition, match=event.value):
            next_state(state, event)


def test_full_cycle_with_exact_times() -> None:
    breaker = CircuitBreaker(BreakerSettings(failure_threshold=3, cooldown_s=5, probes_to_close=2))
    assert breaker.on_failure(1.0) is None and breaker.on_failure(2.0) is None
    trip = breaker.on_failure(3.0)
    assert trip is not None and (trip.before, trip.after, trip.at) == (S.CLOSED, S.OPEN, 3.0)
    assert not breaker.allows_traffic()
    assert breaker.tick(7.9) is None
    assert breaker.tick(8.0).after is S.HALF_OPEN
    assert breaker.on_success(8.5) is None
    assert breaker.on_success(9.0).after is S.CLOSED


def test_failed_probe_doubles_cooldown_up_to_the_cap() -> None:
    breaker = CircuitBreaker(BreakerSettings(failure_threshold=1, cooldown_s=5, max_cooldown_s=12))
    breaker.on_failure(0.0)
    now = 0.0
    cooldowns = []
    for _ in range(3):
        now += breaker.cooldown_s
        assert breaker.tick(now).after is S.HALF_OPEN
        breaker.on_failure(now)
        cooldowns.append(breaker.cooldown_s)
    assert cooldowns == [10, 12, 12]


def test_success_resets_the_failure_count() -> None:
    breaker = CircuitBreaker(BreakerSettings(failure_threshold=3))
    for t in range(10):
        breaker.on_failure(t)
        breaker.on_failure(t)
        breaker.on_success(t)
    assert breaker.state is S.CLOSED


events = st.lists(
    st.tuples(st.sampled_from(["ok", "fail", "tick"]), st.floats(0, 10, allow_nan=False)),
    max_size=100,
)


@given(events)
def test_breaker_invariants(seq) -> None:
    settings = BreakerSettings(failure_threshold=3, cooldown_s=2, max_cooldown_s=16)
    breaker = CircuitBreaker(settings)
    now = 0.0
    for kind, dt in seq:
        now += dt
        before = breaker.state
        transition = {"ok": breaker.on_success, "fail": breaker.on_failure, "tick": breaker.tick}[
            kind
        ](now)
        if transition is not None:
            assert TRANSITIONS[transition.before][transition.event] is transition.after
            assert transition.before is before
        assert breaker.consecutive_failures < settings.failure_threshold
        assert settings.cooldown_s <= breaker.cooldown_s <= settings.max_cooldown_s
        assert breaker.allows_traffic() == (breaker.state is not S.OPEN)
        if breaker.state is S.OPEN:
            assert breaker.opened_at <= now


def test_a_refused_connection_trips_at_once_and_fails_a_probe() -> None:
    breaker = CircuitBreaker(BreakerSettings(failure_threshold=5, cooldown_s=1))
    transition = breaker.on_failure(0.0, fatal=True)
    assert transition is not None and transition.after is BreakerState.OPEN
    breaker.tick(1.0)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.on_failure(1.1, fatal=True).after is BreakerState.OPEN
