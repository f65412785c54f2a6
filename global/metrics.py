"""Prometheus metrics of the global tier, in a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuroute.process_metrics import LATENCY_BUCKETS, register_process_metrics


class GlobalMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        register_process_metrics(r, "global")
        self.requests = Counter(
            "gpuroute_global_requests", "Requests by region served and reason.",
            ["region", "reason"], registry=r,
        )  # fmt: skip
        self.rejections = Counter(
            "gpuroute_global_residency_rejections",
            "Requests refused because the residency rules forbid every region that serves "
            "the model, by rule (reason is always residency).",
            ["reason", "rule"], registry=r,
        )  # fmt: skip
        self.refusals = Counter(
            "gpuroute_global_refusals",
            "Requests no region could take, by reason: residency, model_not_found, "
            "no_backend, region_unavailable.",
            ["reason"], registry=r,
        )  # fmt: skip
        self.answers = Counter(
            "gpuroute_global_responses",
            "Answers on the API routes, by route, status code and the region that answered "
            "(none: the tier answered itself).",
            ["route", "code", "region"], registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "gpuroute_global_request_duration_seconds",
            "Arrival to last byte on the API routes, by route.",
            ["route"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "gpuroute_global_cross_region_retries", "Attempts moved to another region.",
            ["from_region", "to_region"], registry=r,
        )  # fmt: skip
        self.region_state = Gauge(
            "gpuroute_global_region_state", "1 for each region's current state.",
            ["region", "state"], registry=r,
        )  # fmt: skip
        self.client_write_timeouts = Counter(
            "gpuroute_global_client_write_timeouts",
            "Streams cut off because their client fell behind past limits.client_write_timeout_s.",
            registry=r,
        )
        self.continuations = Counter(
            "gpuroute_global_stream_continuations",
            "Streams whose region broke mid-answer: continued in another allowed region, or "
            "ended with the error event and why not (n, seed, no_region, ...).",
            ["reason", "outcome"], registry=r,
        )  # fmt: skip

    def answered(self, route: str, status: int, elapsed: float, region: str | None) -> None:
        self.answers.labels(route, str(status), region or "none").inc()
        self.duration.labels(route).observe(elapsed)
