"""The router's metric children memo: the same children prometheus_client keeps, looked up
once, so a scrape shows exactly what the request path counted."""

from __future__ import annotations

from gpuroute.router.observe.metrics import RouterMetrics
from prometheus_client.parser import text_string_to_metric_families


def samples(metrics: RouterMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == name
    }


def test_children_are_the_metrics_own_and_counts_reach_the_scrape() -> None:
    metrics = RouterMetrics()
    child = metrics.requests_by("/v1/completions", "m", "200")
    assert child is metrics.requests_by("/v1/completions", "m", "200")
    assert child is metrics.requests.labels("/v1/completions", "m", "200")
    for _ in range(3):
        metrics.requests_by("/v1/completions", "m", "200").inc()
    metrics.requests_by("/v1/completions", "m", "429").inc()
    metrics.requests.labels("/v1/completions", "m", "200").inc()  # the library's way, same child
    assert samples(metrics, "gpuroute_requests_total") == {
        (("code", "200"), ("model", "m"), ("route", "/v1/completions")): 4.0,
        (("code", "429"), ("model", "m"), ("route", "/v1/completions")): 1.0,
    }
    metrics.duration_by("/v1/chat/completions", "m").observe(0.07)
    counts = samples(metrics, "gpuroute_request_duration_seconds_bucket")
    assert counts[(("le", "0.05"), ("model", "m"), ("route", "/v1/chat/completions"))] == 0.0
    assert counts[(("le", "0.1"), ("model", "m"), ("route", "/v1/chat/completions"))] == 1.0
