"""Outlier ejection: a per-backend monitor fed results and latencies, decided on interval ticks.

Three detectors, as in Envoy plus one for LLM gray failures:
- consecutive failures (ejects at once),
- failure rate over an interval,
- latency outliers: mean latency ratio (observed / expected for the request's size) above
  `latency_factor` × the pool's median, the slow-but-alive backend.
Ejection lasts base × times ejected (capped); at most `max_ejection_percent` of the pool is
ejected at once. With `enforcing=False` detections are reported but not applied (shadow mode)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    consecutive_failures: int = 5
    interval_s: float = 10.0
    failure_rate: float = 0.5
    failure_rate_min_requests: int = 20
    latency_factor: float = 3.0
    latency_min_requests: int = 10
    latency_min_backends: int = 3
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0
    enforcing: bool = True

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.interval_s <= 0:
            raise ValueError("consecutive_failures must be >= 1 and interval_s > 0")
        if not 0 < self.failure_rate <= 1 or self.latency_factor <= 1:
            raise ValueError("failure_rate must be in (0, 1] and latency_factor > 1")
        if not 0 <= self.max_ejection_percent <= 100:
            raise ValueError("max_ejection_percent must be in [0, 100]")


@dataclass(frozen=True, slots=True)
class Ejection:
    backend_id: str
    reason: str  # "consecutive_failures" | "failure_rate" | "latency"
    enforced: bool
    until: float


@dataclass(slots=True)
class _Monitor:
    consecutive_failures: int = 0
    requests: int = 0
    failures: int = 0
    latency_ratios: list[float] = field(default_factory=list)
    times_ejected: int = 0
    ejected_until: float | None = None

    def reset_interval(self) -> None:
        self.requests = self.failures = 0
        self.latency_ratios.clear()


class OutlierDetector:
    def __init__(self, settings: OutlierSettings | None = None) -> None:
        self.settings = settings or OutlierSettings()
        self._monitors: dict[str, _Monitor] = {}
        self._last_tick: float | None = None
        self.detected = 0
        self.enforced = 0

    def _monitor(self, backend_id: str) -> _Monitor:
        monitor = self._monitors.get(backend_id)
        if monitor is None:
            monitor = self._monitors[backend_id] = _Monitor()
        return monitor

    def is_ejected(self, backend_id: str) -> bool:
        monitor = self._monitors.get(backend_id)
        return monitor is not None and monitor.ejected_until is not None

    def record(
        self, backend_id: str, ok: bool, now: float, latency_ratio: float | None = None
    ) -> Ejection | None:
        """Feed one result; returns an ejection when consecutive failures cross the threshold."""
        monitor = self._monitor(backend_id)
        monitor.requests += 1
        if ok:
            monitor.consecutive_failures = 0
            if latency_ratio is not None:
                monitor.latency_ratios.append(latency_ratio)
            return None
        monitor.failures += 1
        monitor.consecutive_failures += 1
        if monitor.consecutive_failures >= self.settings.consecutive_failures:
            monitor.consecutive_failures = 0
            return self._eject(backend_id, monitor, "consecutive_failures", now)
        return None

    def _eject(
        self, backend_id: str, monitor: _Monitor, reason: str, now: float
    ) -> Ejection | None:
        if monitor.ejected_until is not None:
            return None
        self.detected += 1
        total = len(self._monitors)
        ejected = sum(1 for m in self._monitors.values() if m.ejected_until is not None)
        allowed = (ejected + 1) * 100 <= self.settings.max_ejection_percent * total
        enforced = self.settings.enforcing and allowed
        duration = min(
            self.settings.base_ejection_s * (monitor.times_ejected + 1),
            self.settings.max_ejection_s,
        )
        if enforced:
            self.enforced += 1
            monitor.times_ejected += 1
            monitor.ejected_until = now + duration
        return Ejection(backend_id, reason, enforced, now + duration)

    def tick(self, now: float, backend_ids: list[str]) -> tuple[list[Ejection], list[str]]:
        """Run interval detectors when an interval has passed; return (ejections, returned)."""
        for backend_id in backend_ids:
            self._monitor(backend_id)
        returned = []
        for backend_id, monitor in self._monitors.items():
            if monitor.ejected_until is not None and now >= monitor.ejected_until:
                monitor.ejected_until = None
                returned.append(backend_id)
        if self._last_tick is None:
            self._last_tick = now
            return [], returned
        if now - self._last_tick < self.settings.interval_s:
            return [], returned
        self._last_tick = now
        ejections = self._interval_detectors(now)
        for monitor in self._monitors.values():
            if monitor.ejected_until is None and not monitor.failures and monitor.times_ejected:
                monitor.times_ejected -= 1  # healthy intervals earn back the backoff
            monitor.reset_interval()
        return ejections, returned

    def _interval_detectors(self, now: float) -> list[Ejection]:
        s = self.settings
        found: list[Ejection | None] = []
        for backend_id, monitor in self._monitors.items():
            enough = monitor.requests >= s.failure_rate_min_requests
            if enough and monitor.failures / monitor.requests >= s.failure_rate:
                found.append(self._eject(backend_id, monitor, "failure_rate", now))
        means = {
            backend_id: statistics.fmean(m.latency_ratios)
            for backend_id, m in self._monitors.items()
            if len(m.latency_ratios) >= s.latency_min_requests and m.ejected_until is None
        }
        if len(means) >= s.latency_min_backends:
            median = statistics.median(means.values())
            for backend_id, mean in sorted(means.items()):
                if mean > s.latency_factor * median:
                    monitor = self._monitors[backend_id]
                    found.append(self._eject(backend_id, monitor, "latency", now))
        return [e for e in found if e is not None]
