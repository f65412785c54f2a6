"""What the router says when a backend's health changes: a metric and a log line for each
breaker transition and each ejection."""

from __future__ import annotations

import logging

from gpuroute.router.core.health import HealthEvents
from gpuroute.router.observe.metrics import RouterMetrics

log = logging.getLogger("gpuroute.router")


def report_health(metrics: RouterMetrics, events: HealthEvents) -> None:
    for backend_id, transition in events.breaker:
        metrics.breaker_transitions.labels(backend_id, transition.after.value).inc()
        log.warning(
            "breaker %s: %s -> %s", backend_id, transition.before.value, transition.after.value
        )
    for ejection in events.ejections:
        metrics.ejections.labels(ejection.reason, str(ejection.enforced).lower()).inc()
        log.warning(
            "outlier %s: %s (enforced=%s)",
            ejection.backend_id,
            ejection.reason,
            ejection.enforced,
        )
