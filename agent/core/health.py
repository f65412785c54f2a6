"""The agent's health of its host, as a transition table (pure: `now` is an argument).

Consul hears only transitions (each one is a Raft write), so the machine damps flapping:
the engine must fail `down_after` samples in a row to go critical and answer `up_after` in a
row to come back, and a degraded host stays `warning` for `warning_hold_s` after the last
sign of trouble. Draining is left only by an operator's undrain (or a restart)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Health(enum.Enum):
    WARMING = "warming"  # engine has not answered /health yet: registered but not routable
    PASSING = "passing"
    WARNING = "warning"  # degraded (throttling, hot, ECC errors) but serving: routable
    CRITICAL = "critical"  # engine down after having been up
    DRAINING = "draining"


class Signal(enum.Enum):
    UP = "up"  # engine healthy, host not degraded
    DEGRADED = "degraded"  # engine healthy, host degraded
    DOWN = "down"  # engine not answering /health (enough samples in a row)
    DRAIN = "drain"
    UNDRAIN = "undrain"  # an operator brings a drained host back


H, S = Health, Signal
TRANSITIONS: dict[tuple[Health, Signal], Health] = {
    (H.WARMING, S.UP): H.PASSING,
    (H.WARMING, S.DEGRADED): H.WARNING,
    (H.PASSING, S.DEGRADED): H.WARNING,
    (H.PASSING, S.DOWN): H.CRITICAL,
    (H.WARNING, S.UP): H.PASSING,
    (H.WARNING, S.DOWN): H.CRITICAL,
    (H.CRITICAL, S.UP): H.PASSING,
    (H.CRITICAL, S.DEGRADED): H.WARNING,
}
for _state in Health:
    if _state is not H.DRAINING:
        TRANSITIONS[(_state, S.DRAIN)] = H.DRAINING
TRANSITIONS[(H.DRAINING, S.UNDRAIN)] = H.WARMING  # routable again once the engine answers

# What the TTL check says in each state: (Consul status, output). Outputs are fixed per
# state so that a refresh never changes them (an output change is a catalog write too).
CONSUL_STATUS: dict[Health, str] = {
    H.WARMING: "critical",
    H.PASSING: "passing",
    H.WARNING: "warning",
    H.CRITICAL: "critical",
    H.DRAINING: "critical",
}


@dataclass(frozen=True, slots=True)
class HealthSettings:
    down_after: int = 2  # failed /health samples in a row before critical
    up_after: int = 2  # good samples in a row before critical recovers
    warning_hold_s: float = 10.0  # stay warning this long after the last degraded sample
    hot_temperature_c: float = 87.0


@dataclass(frozen=True, slots=True)
class Transition:
    old: Health
    new: Health
    reason: str


class HostHealth:
    def __init__(self, settings: HealthSettings | None = None) -> None:
        self.settings = settings or HealthSettings()
        self.state = Health.WARMING
        self.reason = "engine not answering /health yet"
        self._fails = 0
        self._oks = 0
        self._degraded_at = float("-inf")

    def observe(
        self, now: float, engine_ok: bool, degraded: str | None = None
    ) -> Transition | None:
        """Feed one sample: whether the engine answered /health, and why the host is degraded
        (None when it is not). Returns the transition it caused, if any."""
        if engine_ok:
            self._fails, self._oks = 0, self._oks + 1
        else:
            self._fails, self._oks = self._fails + 1, 0
        if degraded:
            self._degraded_at = now
        s = self.settings
        if not engine_ok:
            if self.state is Health.WARMING or self._fails < s.down_after:
                return None
            return self._apply(Signal.DOWN, "engine not answering /health")
        if self.state is Health.CRITICAL and self._oks < s.up_after:
            return None
        if degraded or (
            self.state is Health.WARNING and now - self._degraded_at < s.warning_hold_s
        ):
            return self._apply(Signal.DEGRADED, degraded or self.reason)
        return self._apply(Signal.UP, "engine healthy")

    def drain(self, reason: str = "draining") -> Transition | None:
        return self._apply(Signal.DRAIN, reason)

    def undrain(self, reason: str = "undrained by the operator") -> Transition | None:
        self._oks = 0
        return self._apply(Signal.UNDRAIN, reason)

    def _apply(self, signal: Signal, reason: str) -> Transition | None:
        new = TRANSITIONS.get((self.state, signal))
        if new is None:
            return None
        old, self.state, self.reason = self.state, new, reason
        return Transition(old, new, reason)

    @property
    def consul_status(self) -> str:
        return CONSUL_STATUS[self.state]

    @property
    def consul_output(self) -> str:
        return f"{self.state.value}: {self.reason}"


def degraded_reason(
    throttled: bool,
    throttle_reasons: tuple[str, ...],
    max_temperature_c: float | None,
    ecc_uncorrected: int,
    telemetry_error: str | None,
    settings: HealthSettings,
    row_remap_pending: bool = False,
) -> str | None:
    """Why the host should be `warning`, in words that are stable between samples."""
    if throttled:
        return "GPU clocks throttled (" + ", ".join(sorted(throttle_reasons)) + ")"
    if max_temperature_c is not None and max_temperature_c >= settings.hot_temperature_c:
        return f"GPU temperature at or above {settings.hot_temperature_c:g} C"
    if ecc_uncorrected > 0:
        return "uncorrected ECC errors since boot"
    if row_remap_pending:
        return "memory row remapping pending (needs a GPU reset)"
    if telemetry_error:
        return "GPU telemetry failing"
    return None
