"""Is a region up? A transition table with hysteresis (pure: `now` is an argument).

A region goes down when its reports stop (older than `stale_after_s`) or when forwarding to
it fails `down_after_failures` times in a row; it comes back only after `up_after_s` of
fresh reports and no failure, so a flapping region does not pull traffic back and forth.
A region never heard from is `unknown` and takes no traffic."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass


class RegionState(enum.Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"
    RECOVERING = "recovering"  # fresh reports again, serving nothing until up_after_s passed


class RegionEvent(enum.Enum):
    REPORT = "report"
    STALE = "stale"
    FAILING = "failing"
    STEADY = "steady"  # fresh reports for up_after_s


# A router's refusal of one request's model, not of the region: none of its backends serves
# that model now (or none without the fallback the client forbade). A region with no backend
# at all advertises no model, so the policy sends it nothing; its other models stay served.
MODEL_REFUSALS = frozenset({"no_backend"})


def region_failed(status: int, body: bytes) -> bool:
    """Does an answer of `status` (>= 500) count against the region's health? Not a 503
    whose error says only the request's model has no backend there (`body`: its JSON)."""
    if status != 503:
        return True
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return True
    return code not in MODEL_REFUSALS


S, E = RegionState, RegionEvent
TRANSITIONS: dict[tuple[RegionState, RegionEvent], RegionState] = {
    (S.UNKNOWN, E.REPORT): S.UP,
    (S.UP, E.STALE): S.DOWN,
    (S.UP, E.FAILING): S.DOWN,
    (S.DOWN, E.REPORT): S.RECOVERING,
    (S.RECOVERING, E.STALE): S.DOWN,
    (S.RECOVERING, E.FAILING): S.DOWN,
    (S.RECOVERING, E.STEADY): S.UP,
}


@dataclass(frozen=True, slots=True)
class RegionHealthSettings:
    stale_after_s: float = 2.0
    down_after_failures: int = 3
    up_after_s: float = 5.0


class RegionHealth:
    def __init__(self, settings: RegionHealthSettings | None = None) -> None:
        self.settings = settings or RegionHealthSettings()
        self.state = RegionState.UNKNOWN
        self.since = 0.0
        self.last_report: float | None = None
        self.failures = 0

    @property
    def up(self) -> bool:
        return self.state is RegionState.UP

    def _fire(self, event: RegionEvent, now: float) -> RegionState | None:
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            return None
        self.state, self.since = new, now
        return new

    def report(self, now: float) -> RegionState | None:
        self.last_report = now
        return self._fire(RegionEvent.REPORT, now)

    def forwarded(self, ok: bool, now: float) -> RegionState | None:
        if ok:
            self.failures = 0
            return None
        self.failures += 1
        if self.failures >= self.settings.down_after_failures:
            self.failures = 0
            return self._fire(RegionEvent.FAILING, now)
        return None

    def tick(self, now: float) -> RegionState | None:
        """Time-driven transitions: staleness, and the end of a recovery's probation."""
        s = self.settings
        if self.last_report is None or now - self.last_report > s.stale_after_s:
            return self._fire(RegionEvent.STALE, now)
        if self.state is RegionState.RECOVERING and now - self.since >= s.up_after_s:
            return self._fire(RegionEvent.STEADY, now)
        return None
