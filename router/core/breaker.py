"""Circuit breaker as an explicit transition table (h11 style).

Everything that can change a breaker's state is in TRANSITIONS; an event not allowed in the
current state raises IllegalTransition and leaves the state unchanged."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BreakerState(enum.Enum):
    CLOSED = "closed"  # traffic flows; failures are counted
    OPEN = "open"  # no traffic until the cooldown elapses
    HALF_OPEN = "half_open"  # a trickle of probe traffic decides


class BreakerEvent(enum.Enum):
    TRIP = "trip"  # consecutive failures reached the threshold
    COOLDOWN_ELAPSED = "cooldown_elapsed"
    PROBE_SUCCEEDED = "probe_succeeded"  # enough probes succeeded in a row
    PROBE_FAILED = "probe_failed"


TRANSITIONS: dict[BreakerState, dict[BreakerEvent, BreakerState]] = {
    BreakerState.CLOSED: {BreakerEvent.TRIP: BreakerState.OPEN},
    BreakerState.OPEN: {BreakerEvent.COOLDOWN_ELAPSED: BreakerState.HALF_OPEN},
    BreakerState.HALF_OPEN: {
        BreakerEvent.PROBE_SUCCEEDED: BreakerState.CLOSED,
        BreakerEvent.PROBE_FAILED: BreakerState.OPEN,
    },
}


class IllegalTransition(RuntimeError):
    def __init__(self, state: BreakerState, event: BreakerEvent) -> None:
        super().__init__(f"breaker cannot handle {event.value} in state {state.value}")
        self.state, self.event = state, event


def next_state(state: BreakerState, event: BreakerEvent) -> BreakerState:
    try:
        return TRANSITIONS[state][event]
    except KeyError:
        raise IllegalTransition(state, event) from None


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    failure_threshold: int = 5
    cooldown_s: float = 5.0
    max_cooldown_s: float = 120.0  # cooldown doubles on each failed probe, up to this
    probes_to_close: int = 3

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.probes_to_close < 1:
            raise ValueError("failure_threshold and probes_to_close must be >= 1")
        if not 0 < self.cooldown_s <= self.max_cooldown_s:
            raise ValueError("need 0 < cooldown_s <= max_cooldown_s")


@dataclass(frozen=True, slots=True)
class Transition:
    before: BreakerState
    after: BreakerState
    event: BreakerEvent
    at: float


class CircuitBreaker:
    """One backend's breaker. Feed it results and ticks; it returns the transitions it made."""

    def __init__(self, settings: BreakerSettings | None = None) -> None:
        self.settings = settings or BreakerSettings()
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.probe_successes = 0
        self.opened_at = 0.0
        self.cooldown_s = self.settings.cooldown_s

    def allows_traffic(self) -> bool:
        return self.state is not BreakerState.OPEN

    def _fire(self, event: BreakerEvent, now: float) -> Transition:
        before = self.state
        self.state = next_state(before, event)
        if self.state is BreakerState.OPEN:
            self.opened_at = now
        self.consecutive_failures = 0
        self.probe_successes = 0
        return Transition(before, self.state, event, now)

    def on_success(self, now: float) -> Transition | None:
        self.consecutive_failures = 0
        if self.state is BreakerState.HALF_OPEN:
            self.probe_successes += 1
            if self.probe_successes >= self.settings.probes_to_close:
                self.cooldown_s = self.settings.cooldown_s
                return self._fire(BreakerEvent.PROBE_SUCCEEDED, now)
        return None

    def on_failure(self, now: float, *, fatal: bool = False) -> Transition | None:
        """A failed request; `fatal` (connection refused: nothing listens) trips at once."""
        if self.state is BreakerState.HALF_OPEN:
            self.cooldown_s = min(self.cooldown_s * 2, self.settings.max_cooldown_s)
            return self._fire(BreakerEvent.PROBE_FAILED, now)
        if self.state is BreakerState.CLOSED:
            self.consecutive_failures += 1
            if fatal or self.consecutive_failures >= self.settings.failure_threshold:
                return self._fire(BreakerEvent.TRIP, now)
        return None  # late results of requests sent before it opened change nothing

    def vouched(self, now: float) -> Transition | None:
        """Its own health check says the backend is back (Consul passing after critical):
        an open breaker's cooldown ends now, and the probe decides. A restarted engine
        otherwise waits out a cooldown doubled by probes that met it still down."""
        if self.state is BreakerState.OPEN:
            return self._fire(BreakerEvent.COOLDOWN_ELAPSED, now)
        return None

    def tick(self, now: float) -> Transition | None:
        if self.state is BreakerState.OPEN and now - self.opened_at >= self.cooldown_s:
            return self._fire(BreakerEvent.COOLDOWN_ELAPSED, now)
        return None
