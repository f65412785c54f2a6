"""Prometheus metrics of one router, in a registry of its own (no global state): every
metric the router shows is named here, those counted as requests run and those read at
scrape time (backends, the latency model, the pools, the `--workers` parent's own). What the
request path feeds is kept in plain Python and handed to prometheus_client's children, all
at once, before the registry is collected (`Deferred`: no per-call locks; what a scrape
shows is the same)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Protocol

from gpuroute.router.config.autoscale import AutoscaleConfig
from gpuroute.router.config.metrics import BoundedLabels, MetricsConfig
from gpuroute.router.core.autoscale import PoolSize
from gpuroute.router.core.backend import BackendSet
from gpuroute.router.core.health import BackendHealth
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.standby import StandbyRotation
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from gpuroute.process_metrics import LATENCY_BUCKETS, register_process_metrics

DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1)


# -- counted in plain Python, handed over at collection ---------------------------------
class Deferred:
    """A counter's or histogram's child as the request path feeds it: increments summed
    and observations kept in plain Python until the registry is next collected (a scrape,
    any read of a sample), then handed to the child in one go, bucket counts and sum each
    added once (a child's own `observe` takes a lock per bucket and the sum, 2-4 µs, five
    times a request). At most FLUSH_AT observations wait, so memory stays bounded
    without a scrape. `Deferrals` (first in the registry) flushes them."""

    __slots__ = ("added", "child", "values")
    FLUSH_AT = 512

    def __init__(self, child: MetricWrapperBase) -> None:
        self.child = child
        self.added = 0.0
        self.values: list[float] = []

    def inc(self, amount: float = 1) -> None:
        if amount < 0:  # as the child would
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.added += amount

    def observe(self, amount: float) -> None:
        self.values.append(amount)
        if len(self.values) >= self.FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        if self.added:
            added, self.added = self.added, 0.0
            self.child.inc(added)
        if self.values:
            values, self.values = self.values, []
            observe_all(self.child, values)


def observe_all(child: MetricWrapperBase, values: list[float]) -> None:
    """`child.observe(v)` for each of `values` (a histogram's child: prometheus_client's
    buckets, each counting the observations up to its bound that no lower bound took, and
    its sum; tests/unit/test_router_metrics.py holds this to `observe`'s own result)."""
    bounds = child._upper_bounds  # type: ignore[attr-defined]
    counts = [0] * len(bounds)
    for v in values:
        if v == v:  # a NaN is in no bucket (`observe` finds no bound it is under)
            counts[bisect.bisect_left(bounds, v)] += 1
    total = child._sum  # type: ignore[attr-defined]
    running = total.get()
    for v in values:  # in order, as `observe` adds them: the same sum to the last bit
        running += v
    total.set(running)
    for bucket, count in zip(child._buckets, counts, strict=True):  # type: ignore[attr-defined]
        if count:
            bucket.inc(count)


class Deferrals:
    """The deferred children of a registry, flushed before it is collected: registered
    first, so collected first (a registry collects in the order collectors came)."""

    def __init__(self) -> None:
        self.children: list[Deferred] = []

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        for child in self.children:
            child.flush()
        return []

    def add(self, child: MetricWrapperBase) -> Deferred:
        deferred = Deferred(child)
        self.children.append(deferred)
        return deferred


class Children:
    """A labelled metric's children, each looked up once: prometheus_client's `labels()`
    validates, stringifies and locks on every call, a third of a request's metric cost.
    Holds no child the metric does not (nothing here ever removes one). With `deferrals`,
    each child's counts wait for the registry's next collection (`Deferred`)."""

    __slots__ = ("_by_values", "deferrals", "metric")

    def __init__(self, metric: MetricWrapperBase, deferrals: Deferrals | None = None) -> None:
        self.metric, self.deferrals = metric, deferrals
        self._by_values: dict[tuple[str, ...], MetricWrapperBase | Deferred] = {}

    def __call__(self, *values: str) -> MetricWrapperBase | Deferred:
        child = self._by_values.get(values)
        if child is None:
            child = self.metric.labels(*values)
            if self.deferrals is not None:
                child = self.deferrals.add(child)
            self._by_values[values] = child
        return child


class BackendCollector:
    """Per-backend state read at scrape time: state, breaker, in flight, outstanding work."""

    def __init__(self, backends: BackendSet, health: BackendHealth) -> None:
        self.backends, self.health = backends, health

    def collect(self):
        state = GaugeMetricFamily(
            "gpuroute_backend_state",
            "1 for the backend's current state.",
            labels=["backend", "state"],
        )
        breaker = GaugeMetricFamily(
            "gpuroute_backend_breaker_open",
            "1 while the backend's circuit breaker is open or half-open.",
            labels=["backend", "breaker"],
        )
        in_flight = GaugeMetricFamily(
            "gpuroute_backend_in_flight", "Requests in flight.", labels=["backend"]
        )
        outstanding = GaugeMetricFamily(
            "gpuroute_backend_outstanding_seconds",
            "Booked GPU-seconds of work.",
            labels=["backend"],
        )
        for b in self.backends:
            state.add_metric([b.backend_id, b.state.value], 1)
            brk = self.health.breaker(b.backend_id).state
            breaker.add_metric([b.backend_id, brk.value], float(brk.value != "closed"))
            in_flight.add_metric([b.backend_id], b.in_flight)
            outstanding.add_metric([b.backend_id], b.outstanding)
        slowness = GaugeMetricFamily(
            "gpuroute_backend_slowness",
            "Observed/expected duration against the fleet median (1 = typical).",
            labels=["backend"],
        )
        for b in self.backends:
            slowness.add_metric([b.backend_id], b.slowness)
        yield from (state, breaker, in_flight, outstanding, slowness)


class LatencyModelCollector:
    """What the latency model has learned (docs/scheduling.md), read at scrape time."""

    def __init__(self, latency: LatencyModel) -> None:
        self.latency = latency

    def collect(self):
        overhead = GaugeMetricFamily(
            "gpuroute_latency_overhead_seconds",
            "Learned fixed part of TTFT outside the GPU (HTTP hops, flushes), per GPU type.",
            labels=["gpu"],
        )
        for gpu, seconds in sorted(self.latency.overhead_s.items()):
            overhead.add_metric([gpu], seconds)
        ratios = GaugeMetricFamily(
            "gpuroute_latency_ratio",
            "Learned observed/predicted ratio per GPU type (1 = the roofline prior).",
            labels=["gpu", "measure"],
        )
        for measure, learned in (
            ("ttft", self.latency.ttft_ratio),
            ("tpot", self.latency.tpot_ratio),
        ):
            for gpu, ratio in sorted(learned.items()):
                ratios.add_metric([gpu, measure], ratio)
        yield from (overhead, ratios)


# the pools' gauges: (metric, the PoolSize attribute it shows, help)
POOL_GAUGES = (
    ("gpuroute_pool_desired_backends", "active", "Backends in rotation the pool should "
     "have (what the GPU groups' scaling policy follows)."),
    ("gpuroute_pool_desired_standby_backends", "standby", "Warm standby backends wanted on "
     "top of those in rotation."),
    ("gpuroute_pool_arrival_rate_rps", "rate_rps", "The smoothed arrival rate the pool was "
     "sized with (the region's, where replicas share theirs), in requests/s."),
    ("gpuroute_pool_forecast_rps", "forecast_rps", "The demand the pool was sized for: the "
     "highest expected within one lead time, in requests/s."),
    ("gpuroute_pool_utilisation", "utilisation", "The arrival rate over the SLO capacity of "
     "the backends in rotation."),
    ("gpuroute_pool_backend_capacity_rps", "capacity_rps", "One backend's SLO capacity in the "
     "pool, in requests/s."),
)  # fmt: skip
STANDBY_COUNTERS = (  # (metric, the StandbyRotation count per pool, help)
    ("gpuroute_standby_promotions", "promoted_into", "Standby backends brought into the "
     "pool's rotation before a request would wait."),
    ("gpuroute_standby_releases", "released_from", "Promoted standby backends sent back "
     "once the pool stayed quiet."),
)  # fmt: skip


class Pools(Protocol):
    """What the pools' collector reads of the autoscaler (router/scaling/autoscaler.py)."""

    config: AutoscaleConfig
    sizes: dict[str, PoolSize]
    standby: StandbyRotation


class PoolCollector:
    """The pools' last sizes (only where sizing is shown) and the standby rotation's
    promotions and releases, read at scrape time, labelled by pool (the model name)."""

    def __init__(self, autoscaler: Pools) -> None:
        self.autoscaler = autoscaler

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        a = self.autoscaler
        if a.config.enabled:
            sizes = sorted(a.sizes.items())
            for name, attribute, documentation in POOL_GAUGES:
                gauge = GaugeMetricFamily(name, documentation, labels=["pool"])
                for pool, size in sizes:
                    gauge.add_metric([pool], float(getattr(size, attribute)))
                yield gauge
        for name, attribute, documentation in STANDBY_COUNTERS:
            counter = CounterMetricFamily(name, documentation, labels=["pool"])
            for pool, count in sorted(getattr(a.standby, attribute).items()):
                counter.add_metric([pool], count)
            yield counter


def worker_families(up: int, restarts: Sequence[int]) -> list[GaugeMetricFamily]:
    """The `--workers` parent's own metrics, beside its workers' merged ones."""
    running = GaugeMetricFamily("gpuroute_workers_up", "Worker processes running.")
    running.add_metric([], up)
    restarted = CounterMetricFamily(
        "gpuroute_worker_restarts", "Workers restarted after dying.", labels=["worker"]
    )
    for index, n in enumerate(restarts):
        restarted.add_metric([str(index)], n)
    return [running, restarted]


class RouterMetrics:
    """The router's metrics. `model_label` bounds every `model` label and `tenant_label`
    every `tenant` label (router/config/metrics.py; by default every model is `other`, and
    the first [metrics] max_tenants tenants are named)."""

    def __init__(
        self, model_label: BoundedLabels | None = None, tenant_label: BoundedLabels | None = None
    ) -> None:
        self.model_label, self.tenant_label = (
            model_label or BoundedLabels(0),
            tenant_label or BoundedLabels(MetricsConfig().max_tenants),
        )
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.deferrals = Deferrals()  # first: flushed before any metric is collected
        r.register(self.deferrals)
        register_process_metrics(r, "router")
        self._request_latencies(r)
        self.decision = Histogram(
            "gpuroute_decision_seconds",
            "Time to pick a backend.",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "gpuroute_retries", "Attempts after the first, by reason.", ["reason"], registry=r
        )
        self.retry_budget_exhausted = Counter(
            "gpuroute_retry_budget_exhausted", "Retries refused by the budget.", registry=r
        )
        self.upstream_connections = Counter(
            "gpuroute_upstream_connections_opened",
            "Connections opened to engines, by engine address and why: none idle in the pool"
            " (empty) or one the engine had closed under a request (replaced).",
            ["origin", "why"],
            registry=r,
        )
        self.upstream_failures = Counter(
            "gpuroute_upstream_failures",
            "Failed attempts, by backend and kind.",
            ["backend", "kind"],
            registry=r,
        )
        self.stream_errors = Counter(
            "gpuroute_stream_errors",
            "Streams that broke after bytes reached the client.",
            ["backend"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "gpuroute_client_disconnects", "Clients that went away before the end.", registry=r
        )
        self.client_write_timeouts = Counter(
            "gpuroute_client_write_timeouts",
            "Streams cut off because their client fell behind past limits.client_write_timeout_s "
            "(the engine request aborted).",
            registry=r,
        )
        self.shed = Counter(
            "gpuroute_shed", "Requests refused by admission, by reason.", ["reason"], registry=r
        )
        self.queue_depth = Gauge(
            "gpuroute_queue_depth", "Requests waiting for admission.", registry=r
        )
        self.slo_requests = Counter(
            "gpuroute_slo_requests",
            "Finished requests by SLO class, the model that served them (a split's version, "
            "a fallback) and outcome (met, missed, refused): attainment per class and model.",
            ["slo_class", "model", "outcome"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "gpuroute_audio_seconds",
            "Seconds of audio admitted on the transcription and translation routes, by tenant.",
            ["tenant"],
            registry=r,
        )
        self.slo_held = Counter(
            "gpuroute_slo_held",
            "Requests held because no backend was predicted to meet their SLO.",
            ["slo_class"],
            registry=r,
        )
        self.in_flight = Gauge("gpuroute_in_flight", "Requests being served.", registry=r)
        self.ejections = Counter(
            "gpuroute_ejections",
            "Outlier ejections, by reason and enforcement.",
            ["reason", "enforced"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            "gpuroute_breaker_transitions", "Breaker state changes.", ["backend", "to"], registry=r
        )

        self.membership_stale = Gauge(
            "gpuroute_membership_stale",
            "1 while Consul cannot be reached: routing on the last known backend set.",
            registry=r,
        )
        self.reloads = Counter(
            "gpuroute_config_reloads",
            "Config reloads asked for, by outcome (applied, refused) and how (http, signal).",
            ["outcome", "via"],
            registry=r,
        )
        self.membership_changes = Counter(
            "gpuroute_membership_changes",
            "Backend set changes from Consul, by kind (joined, down, up, left, standby, active, "
            "removed).",
            ["change"],
            registry=r,
        )
        self._load_streams(r)
        self._answers(r)

        self.quota_refusals = Counter(
            "gpuroute_quota_refusals",
            "Requests refused by a tenant's quota, by limit (requests, tokens).",
            ["tenant", "limit"],
            registry=r,
        )
        self.quota_settled_tokens = Counter(
            "gpuroute_quota_settled_tokens",
            "Tokens a request used beyond its admission charge (debt) or short of it (refund), "
            "settled against its tenant's token quota.",
            ["tenant", "direction"],
            registry=r,
        )
        self.residency_refusals = Counter(
            "gpuroute_residency_refusals",
            "Requests refused because the key's residency set excludes this router's region.",
            ["tenant"],
            registry=r,
        )
        self.decision_refusals = Counter(
            "gpuroute_residency_decision_refusals",
            "Requests refused at the residency decision check, by reason (missing, invalid, "
            "other_key, excluded, replayed).",
            ["reason"],
            registry=r,
        )
        self.shared_load_healthy = Gauge(
            "gpuroute_shared_load_healthy",
            "1 while replicas' outstanding work is exchanged through Redis.",
            registry=r,
        )
        self.quota_shared = Gauge(
            "gpuroute_quota_shared",
            "1 while quotas are enforced through Redis, 0 on local fallback buckets.",
            registry=r,
        )
        self.usage_flush_failures = Counter(
            "gpuroute_usage_flush_failures",
            "Flushes of per-tenant usage records to Redis that failed (kept, sent again).",
            registry=r,
        )
        self.usage_unflushed = Gauge(
            "gpuroute_usage_unflushed_cells",
            "Usage record cells (hour, tenant, model) counted here and not yet in Redis.",
            registry=r,
        )
        self.usage_dropped = Counter(
            "gpuroute_usage_dropped_cells",
            "Usage record cells dropped before reaching Redis: older than retention_days.",
            registry=r,
        )
        self.redis_configured = Gauge(
            "gpuroute_redis_configured",
            "1 where Redis is configured for what `shared` names: quotas (a Redis URL is "
            "set) and load (it is, with share_load on).",
            ["shared"],
            registry=r,
        )

        self._per_request()

    def _per_request(self) -> None:
        """The children every request touches, their counts deferred (`Deferred`)."""
        d = self.deferrals
        self.requests_by = Children(self.requests, d)
        self.duration_by = Children(self.duration, d)
        self.ttft_by = Children(self.ttft, d)
        self.first_token_by = Children(self.first_token, d)
        self.inter_token_by = Children(self.inter_token, d)
        self.backend_duration_by = Children(self.backend_duration, d)
        self.slo_requests_by = Children(self.slo_requests, d)
        self.decision_timing = d.add(self.decision)  # every pick's

    def _answers(self, r: CollectorRegistry) -> None:
        """What the answers used (router/usage/tokens.py) and what continuing broken
        streams cost (router/attempts/stream_continuer.py)."""
        self.tokens = Counter(
            "gpuroute_tokens",
            "Tokens as the engines' usage reports them, by served model and tenant (beyond "
            "[metrics] max_models and max_tenants: other) and direction (prompt, completion).",
            ["model", "tenant", "direction"],
            registry=r,
        )
        self.continuations = Counter(
            "gpuroute_stream_continuations",
            "Streams whose engine broke mid-answer: continued on another backend, or ended "
            "with the error event and why not (n, logprobs, seed, tool_calls, no_backend, ...).",
            ["reason", "outcome"],
            registry=r,
        )
        self.continuation_prefill = Counter(
            "gpuroute_stream_continuation_prefill_tokens",
            "Prompt tokens sent to continue broken streams (the prompt and the text so far, "
            "prefilled again where the stream goes on): the GPU work continuations cost.",
            registry=r,
        )

    def _load_streams(self, r: CollectorRegistry) -> None:
        """The agents' load streams: how fresh, and which were cut as untrustworthy."""
        self.agents_stale = Gauge(
            "gpuroute_agents_stale",
            "Discovered backends whose agent load report is older than load_stale_s.",
            registry=r,
        )
        self.load_streams_refused = Counter(
            "gpuroute_load_streams_refused",
            "Agent load streams cut because a report could not speak for the backend it was "
            "opened for, or the agent refused this router, by reason (other_backend, "
            "no_proof, agent_refused).",
            ["reason"],
            registry=r,
        )
        self.load_report_age = Histogram(
            "gpuroute_load_report_age_seconds",
            "Age of an agent's load sample when it reaches the router.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )

    def count_reload(self, outcome: str, via: str) -> None:
        self.reloads.labels(outcome, via).inc()

    def _request_latencies(self, r: CollectorRegistry) -> None:
        """What each answered request is counted and timed in, by route and model."""
        self.requests = Counter(
            "gpuroute_requests",
            "Requests answered, by route, model (the one that served it; refused: the one "
            "asked for) and status.",
            ["route", "model", "code"],
            registry=r,
        )
        self.duration = Histogram(
            "gpuroute_request_duration_seconds",
            "Arrival to last byte, by route and model.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gpuroute_time_to_first_byte_seconds",
            "Arrival to the first response byte reaching the client, by route and model.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_token = Histogram(
            "gpuroute_time_to_first_token_seconds",
            "Arrival to the first generated text reaching the client (TTFT; a stream's "
            "role-only first event does not count; a whole answer: its first byte).",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "gpuroute_inter_token_latency_seconds",
            "Per stream, the mean time between its output tokens: (its end, which comes with "
            "the last token - its first token) / (output tokens - 1), observed once at the end "
            "of each complete stream with 2 or more output tokens, by model.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.backend_duration = Histogram(
            "gpuroute_backend_request_duration_seconds",
            "Dispatch of the attempt that answered to its last byte, by backend.",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def watch_backends(
        self, backends: BackendSet, health: BackendHealth, latency: LatencyModel | None = None
    ) -> None:
        self.registry.register(BackendCollector(backends, health))
        if latency is not None:
            self.registry.register(LatencyModelCollector(latency))

    def watch_pools(self, autoscaler: Pools) -> None:
        self.registry.register(PoolCollector(autoscaler))

    def render(self) -> bytes:
        return generate_latest(self.registry)
