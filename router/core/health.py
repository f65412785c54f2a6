"""Passive health: breakers and outlier ejection applied to a BackendSet.

Both detectors are pure; this module turns their verdicts into backend states: an open
breaker or an enforced ejection makes a backend EJECTED; recovery puts it in WARMING so slow
start ramps its share back up (a half-open breaker's probes are that trickle)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.breaker import (
    BreakerSettings,
    BreakerState,
    CircuitBreaker,
    Transition,
)
from gpuroute.router.core.outlier import Ejection, OutlierDetector, OutlierSettings

# an active health check's verdicts (BackendHealth.checked)
CHECK_OK, CHECK_DOWN, CHECK_SLOW = "ok", "down", "slow"


@dataclass(slots=True)
class HealthEvents:
    """What changed during one call, for metrics and logs."""

    breaker: list[tuple[str, Transition]] = field(default_factory=list)
    ejections: list[Ejection] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)


class BackendHealth:
    def __init__(
        self,
        backends: BackendSet,
        breaker: BreakerSettings | None = None,
        outlier: OutlierSettings | None = None,
        *,
        active_probes: bool = False,
    ) -> None:
        self.backends = backends
        self.breaker_settings = breaker or BreakerSettings()
        self.outliers = OutlierDetector(outlier)
        self._breakers: dict[str, CircuitBreaker] = {}
        # With active probes the shell health-checks half-open backends itself and real
        # requests never go there; without (the simulator), one real request is the probe.
        self.active_probes = active_probes
        self.half_open: set[str] = set()
        self._failed_checks: dict[str, int] = {}  # active checks failed in a row

    def breaker(self, backend_id: str) -> CircuitBreaker:
        breaker = self._breakers.get(backend_id)
        if breaker is None:
            breaker = self._breakers[backend_id] = CircuitBreaker(self.breaker_settings)
        return breaker

    def wants_probe(self, backend: Backend) -> bool:
        """Without active probes, a half-open breaker takes one real request at a time."""
        return (
            not self.active_probes
            and backend.backend_id in self.half_open
            and backend.in_flight == 0
        )

    def record(
        self,
        backend: Backend,
        ok: bool,
        now: float,
        latency_ratio: float | None = None,
        *,
        fatal: bool = False,
    ) -> HealthEvents:
        events = HealthEvents()
        breaker = self.breaker(backend.backend_id)
        transition = breaker.on_success(now) if ok else breaker.on_failure(now, fatal=fatal)
        if transition is not None:
            events.breaker.append((backend.backend_id, transition))
            self._apply_breaker(backend, transition, now)
        ejection = self.outliers.record(backend.backend_id, ok, now, latency_ratio)
        if ejection is not None:
            events.ejections.append(ejection)
            self._apply_ejection(backend, ejection, now)
        return events

    def checked(
        self, backend: Backend, verdict: str, now: float, failures_out: int
    ) -> HealthEvents:
        """An active health check's verdict (CHECK_OK, CHECK_DOWN: refused, reset or not
        200; CHECK_SLOW: no answer in time): `failures_out` failed in a row trip a closed
        breaker, so the backend leaves rotation before a request finds it dead. Slow answers
        trip it only while every model it serves keeps another backend in rotation: an
        engine swamped by a burst answers /health late too, and taking a model's last
        engine out for it would turn overload into an outage. Once checks tripped it, the
        first pass ends its cooldown and the half-open probes decide the way back (a breaker
        that requests tripped keeps its own cooldown: an engine can pass /health and fail
        every request). Checks never count in outlier statistics."""
        events = HealthEvents()
        breaker = self.breaker(backend.backend_id)
        if verdict == CHECK_OK:
            tripped = self._failed_checks.pop(backend.backend_id, 0) >= failures_out
            transition = breaker.vouched(now) if tripped else None
        else:
            failed = self._failed_checks.get(backend.backend_id, 0) + 1
            self._failed_checks[backend.backend_id] = failed
            trips = failed >= failures_out and breaker.state is BreakerState.CLOSED
            if verdict == CHECK_SLOW:
                trips = trips and self._spare(backend)
            transition = breaker.on_failure(now, fatal=True) if trips else None
        if transition is not None:
            events.breaker.append((backend.backend_id, transition))
            self._apply_breaker(backend, transition, now)
        return events

    def holds_out(self, backend_id: str) -> bool:
        """Its breaker lets no traffic through, or an ejection holds it out."""
        return not self.breaker(backend_id).allows_traffic() or self.outliers.is_ejected(backend_id)

    def _spare(self, backend: Backend) -> bool:
        """Every model `backend` serves has another backend in rotation."""
        return all(
            any(other is not backend for other in self.backends.routable(model))
            for model in backend.models
        )

    def vouched(self, backend: Backend, now: float) -> HealthEvents:
        """The backend's agent says it is healthy again: probe it now (CircuitBreaker.vouched)."""
        events = HealthEvents()
        transition = self.breaker(backend.backend_id).vouched(now)
        if transition is not None:
            events.breaker.append((backend.backend_id, transition))
            self._apply_breaker(backend, transition, now)
        return events

    def tick(self, now: float) -> HealthEvents:
        events = HealthEvents()
        for backend in list(self.backends):
            transition = self.breaker(backend.backend_id).tick(now)
            if transition is not None:
                events.breaker.append((backend.backend_id, transition))
                self._apply_breaker(backend, transition, now)
        ids = [b.backend_id for b in self.backends]
        ejections, returned = self.outliers.tick(now, ids)
        for ejection in ejections:
            if ejection.backend_id in self.backends:
                self._apply_ejection(self.backends.get(ejection.backend_id), ejection, now)
        for backend_id in returned:
            if backend_id in self.backends:
                backend = self.backends.get(backend_id)
                if (
                    backend.state is BackendState.EJECTED
                    and self.breaker(backend_id).allows_traffic()
                ):
                    self.backends.set_state(backend, BackendState.WARMING, now, "ejection ended")
        self.backends.finish_warmups(now)
        events.ejections.extend(ejections)
        events.returned.extend(returned)
        return events

    def _apply_breaker(self, backend: Backend, transition: Transition, now: float) -> None:
        if transition.after is BreakerState.HALF_OPEN:
            self.half_open.add(backend.backend_id)
        else:
            self.half_open.discard(backend.backend_id)
        draining = backend.state is BackendState.DRAINING
        if transition.after is BreakerState.OPEN and not draining:
            self.backends.set_state(backend, BackendState.EJECTED, now, "breaker open")
        elif (
            transition.after is BreakerState.HALF_OPEN
            and not draining
            and not self.outliers.is_ejected(backend.backend_id)
        ):
            self.backends.set_state(backend, BackendState.WARMING, now, "breaker half-open")

    def _apply_ejection(self, backend: Backend, ejection: Ejection, now: float) -> None:
        if ejection.enforced and backend.state is not BackendState.DRAINING:
            self.backends.set_state(
                backend, BackendState.EJECTED, now, f"outlier: {ejection.reason}"
            )
