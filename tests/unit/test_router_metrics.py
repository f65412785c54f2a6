"""The router's metric children memo: the same children prometheus_client keeps, looked up
once, their counts deferred to the registry's next collection, so a scrape shows exactly
what the request path counted."""

from __future__ import annotations

import math
import platform
import random

from gpuroute.router.observe.metrics import LATENCY_BUCKETS, Deferrals, Deferred, RouterMetrics
from prometheus_client import CollectorRegistry, Histogram
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
    assert child.child is metrics.requests.labels("/v1/completions", "m", "200")
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


def exposed_after(values: list[float], *, deferred: bool) -> dict[tuple, str]:
    """Each sample of a histogram fed `values` (through a Deferred, or the child's own
    `observe`), as `float.hex`: bit for bit, and a NaN equal to a NaN."""
    registry, deferrals = CollectorRegistry(), Deferrals()
    registry.register(deferrals)
    histogram = Histogram("h", "h", ["model"], buckets=LATENCY_BUCKETS, registry=registry)
    child = histogram.labels("m")
    observe = deferrals.add(child).observe if deferred else child.observe
    for v in values:
        observe(v)
    return {
        (s.name, s.labels.get("le")): float(s.value).hex()
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_deferred_observations_scrape_as_the_librarys_own_observe() -> None:
    """Bucket edges, values past the last bound, zero, a NaN: the deferred child's buckets,
    count and sum are those `observe` gives value by value, to the last bit (the library's
    internals it writes to are pinned; a change there fails here). A NaN, as `observe`
    takes it, is in no bucket (so not counted) and makes the sum NaN."""
    rng = random.Random(5)
    values = [*LATENCY_BUCKETS, 0.0, 301.0, 1e9] + [rng.uniform(0, 400) for _ in range(1500)]
    with_nan = [*values[:700], math.nan, *values[700:]]
    for case in (values, with_nan):
        own, deferred = (exposed_after(case, deferred=d) for d in (False, True))
        assert own == deferred
        assert own[("h_count", None)] == float(len(values)).hex()  # (the NaN not counted)
        assert math.isnan(float.fromhex(own[("h_sum", None)])) is (case is with_nan)


def test_counts_wait_no_longer_than_the_next_read_and_stay_bounded() -> None:
    metrics = RouterMetrics()
    metrics.requests_by("/v1/completions", "m", "200").inc()
    metrics.decision_timing.observe(1e-4)
    read = metrics.registry.get_sample_value
    assert read("gpuroute_requests_total", {"route": "/v1/completions", "model": "m",
                                           "code": "200"}) == 1.0  # fmt: skip
    assert read("gpuroute_decision_seconds_count") == 1.0
    for _ in range(Deferred.FLUSH_AT):
        metrics.decision_timing.observe(1e-4)
    assert metrics.decision_timing.values == []  # handed over without a read


def test_every_tier_exports_its_build_and_process_and_no_created_series() -> None:
    from gpuroute.agent.metrics import AgentMetrics
    from gpuroute.global_.metrics import GlobalMetrics

    from gpuroute.process_metrics import gpuroute_version

    for tier, registry in (
        ("router", RouterMetrics().registry),
        ("global", GlobalMetrics().registry),
        ("agent", AgentMetrics().registry),
    ):
        names = {s.name for family in registry.collect() for s in family.samples}
        info = registry.get_sample_value(
            "gpuroute_build_info",
            {"version": gpuroute_version(), "python": platform.python_version(), "tier": tier},
        )
        assert info == 1.0, tier
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names, tier
        assert not [n for n in names if n.endswith("_created")], tier
