"""Regional router configuration (TOML), validated with errors that name file and key."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from gpuroute.router.config.auth import AuthConfig, key_problem
from gpuroute.router.config.autoscale import AutoscaleConfig
from gpuroute.router.config.metrics import MetricsConfig
from gpuroute.router.config.models import RouterModelConfig, check_models, shapes
from gpuroute.router.config.rebalance import RouterRebalanceConfig
from gpuroute.router.config.redis import RedisConfig
from gpuroute.router.config.responses import ResponsesConfig
from gpuroute.router.config.usage import UsageConfig
from gpuroute.router.config.workers import WorkersConfig
from gpuroute.router.core.policies import (
    DEFAULT_POLICY,
    POLICIES,
    OlderKey,
    check_policy_table,
    settings_table,
)
from gpuroute.router.core.slo import DEFAULT_SLO_CLASS, DEFAULT_SLO_CLASSES, SloClass
from pydantic import AfterValidator, Field, field_validator, model_validator

from gpuroute.access_log import AccessLogConfig
from gpuroute.admin_guard import AdminAccess, admin_placement
from gpuroute.config import (
    HttpUrl,
    LimitsConfig,
    ListenConfig,
    StrictModel,
    known_name,
    load_toml_model,
)
from gpuroute.continuation.text import ContinuationConfig
from gpuroute.gpus import DeclaresGpuTypes, GpuTypeName
from gpuroute.headers import engine_header
from gpuroute.models import MODELS, ModelSpec
from gpuroute.openai_api import API_ROUTES
from gpuroute.secrets import secret_forms
from gpuroute.tls import ClientTlsConfig
from gpuroute.tracing import TracingConfig

PolicyName = Annotated[str, AfterValidator(lambda v: known_name(v, POLICIES, "policy"))]


class BackendConfig(StrictModel):
    url: HttpUrl
    gpu: GpuTypeName
    models: list[str] = Field(min_length=1)
    id: str | None = None  # defaults to host:port
    capacity: float | None = Field(default=None, gt=0)  # default: from the GPU type
    max_inflight: int = Field(default=256, ge=1)  # beyond this the router queues
    # GPUs the engine spans: tensor parallel × pipeline parallel (priors split the model
    # over them and add the all-reduces)
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    pipeline_parallel: int = Field(default=1, ge=1, le=64)
    # which of `models` are LoRA adapters (kept on few engines: docs/scheduling.md)
    lora_adapters: list[str] = Field(default_factory=list)

    @property
    def backend_id(self) -> str:
        if self.id:
            return self.id
        parts = urlsplit(self.url)
        return f"{parts.hostname}:{parts.port}"


class RetryConfig(StrictModel):
    max_attempts: int = Field(default=3, ge=1)
    budget_ratio: float = Field(default=0.2, ge=0, le=1)  # retries in flight / requests
    min_retries_concurrent: int = Field(default=3, ge=0)
    backoff_base_s: float = Field(default=0.025, ge=0)
    backoff_max_s: float = Field(default=0.25, ge=0)
    # Requests waiting for a first byte from a backend ejected or this many times slower
    # than the fleet are moved elsewhere (0 = never); see router/core/slowness.py should_rescue.
    rescue_slowness: float = Field(default=10.0, ge=0)


class AdmissionConfig(StrictModel):
    priorities: list[str] = Field(default=["high", "normal", "low"], min_length=1)
    default_priority: str = "normal"
    max_queue: int = Field(default=1024, ge=0)
    default_timeout_s: float = Field(default=30.0, gt=0)
    # share of in-flight slots only the first (most important) class may use
    reserved_top_fraction: float = Field(default=0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _default_is_known(self) -> AdmissionConfig:
        known_name(self.default_priority, self.priorities, "priority")
        return self


class HealthCheckConfig(StrictModel):
    """Active health checks of the backends no agent vouches for (`[[backends]]` and those
    the admin API adds): `health_check_path` every `interval_s`. `failures_out` failed in a
    row trip the backend's breaker (out of rotation); it comes back as the breaker does,
    `breaker.probes_to_close` passing checks once one check passes again."""

    interval_s: float = Field(default=2.0, ge=0, le=3600)  # 0: no active checks
    timeout_s: float = Field(default=1.0, gt=0, le=60)
    failures_out: int = Field(default=3, ge=1, le=100)


class BreakerConfig(StrictModel):
    failure_threshold: int = Field(default=5, ge=1)
    cooldown_s: float = Field(default=5.0, gt=0)
    max_cooldown_s: float = Field(default=120.0, gt=0)
    probes_to_close: int = Field(default=3, ge=1)


class OutlierConfig(StrictModel):
    consecutive_failures: int = Field(default=5, ge=1)
    interval_s: float = Field(default=5.0, gt=0)
    failure_rate: float = Field(default=0.5, gt=0, le=1)
    latency_factor: float = Field(default=3.0, gt=1)
    base_ejection_s: float = Field(default=30.0, gt=0)
    max_ejection_percent: float = Field(default=50.0, ge=0, le=100)
    enforcing: bool = True


class MembershipConfig(StrictModel):
    """Backends discovered through Consul (`consul` set) instead of, or besides, `backends`."""

    consul: str | None = None  # e.g. "http://127.0.0.1:8500", the local Consul agent
    token: str | None = None
    token_file: str | None = None
    token_env: str | None = None
    check_secret_forms = secret_forms("token", "load_stream_token")
    datacenter: str | None = None
    service: str = "gpuroute-engine"
    wait_s: float = Field(default=30.0, ge=1, le=600)  # blocking-query wait (Consul caps 10m)
    min_interval_s: float = Field(default=0.05, ge=0)  # rate limit between blocking queries
    timeout_s: float = Field(default=3.0, gt=0)
    max_inflight: int = Field(default=256, ge=1)  # per discovered backend
    load_streams: bool = True  # open each agent's gRPC load stream
    load_stream_tls: ClientTlsConfig | None = None  # (m)TLS to agents' load streams
    # shared with the agents' load_stream.token: set, a report counts only with the agent's
    # proof, and this router proves itself to agents (gpuroute/load_auth.py)
    load_stream_token: str | None = None
    load_stream_token_file: str | None = None
    load_stream_token_env: str | None = None
    load_stale_s: float = Field(default=1.0, gt=0)  # older agent reports are ignored
    # after Consul comes back (restarted, or reached again), how long a member it no longer
    # lists stays while its agent vouches for it; otherwise a deregistered member leaves
    consul_restart_grace_s: float = Field(default=30.0, ge=0)


class RegionConfig(StrictModel):
    """This router's region, as the global tier sees it (report_listen unset: no reports)."""

    name: str = "local"
    jurisdiction: str | None = None  # what API keys' residency sets may name besides the region
    report_listen: ListenConfig | None = None  # gRPC RegionLoad.WatchRegion
    # with membership.consul and report_listen: its gpuroute-router address in Consul
    advertise_address: str | None = None  # (default: the listen host)
    report_period_s: float = Field(default=0.5, gt=0, le=10)
    saturation_delay_s: float = Field(default=2.0, gt=0)  # work ahead at which it is "full"
    # The key the global tier signs its residency decisions with (gpuroute/residency_decision.py):
    # set, a decision that excludes this region is refused (403); with
    # require_global_decision, so is a request that carries none.
    decision_key: str | None = None
    decision_key_file: str | None = None
    decision_key_env: str | None = None
    check_secret_forms = secret_forms("decision_key")
    require_global_decision: bool = False

    @property
    def place(self) -> frozenset[str]:
        """What residency sets may name to allow this router: its region and jurisdiction."""
        return frozenset(p for p in (self.name, self.jurisdiction) if p is not None)

    @model_validator(mode="after")
    def _decisions_need_a_key_and_a_jurisdiction(self) -> RegionConfig:
        keys = (self.decision_key, self.decision_key_file, self.decision_key_env)
        if self.require_global_decision and all(k is None for k in keys):
            raise ValueError("region.require_global_decision: set region.decision_key too")
        if any(k is not None for k in keys) and self.jurisdiction is None:
            # the global tier's decisions name jurisdictions (eu, us), never regions
            raise ValueError("region.decision_key: set region.jurisdiction too")
        return self


# $/hour per GPU type (the slo_aware policy's cost score); names and prices checked
GpuPrices = dict[GpuTypeName, Annotated[float, Field(gt=0)]]


class SloClassConfig(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_-]+$")
    ttft_s: float = Field(gt=0)
    tpot_s: float = Field(gt=0)
    e2e_s: float | None = Field(default=None, gt=0)

    def slo_class(self) -> SloClass:
        return SloClass(self.name, self.ttft_s, self.tpot_s, self.e2e_s)


class SloConfig(StrictModel):
    """Service-level objectives (docs/scheduling.md): classes most important first; a
    request's class comes from its key, else the `x-gpuroute-slo` header (never more
    demanding than its key's or the default class), else `default_class`."""

    classes: list[SloClassConfig] = Field(
        default_factory=lambda: [
            SloClassConfig(name=c.name, ttft_s=c.ttft_s, tpot_s=c.tpot_s, e2e_s=c.e2e_s)
            for c in DEFAULT_SLO_CLASSES
        ],
        min_length=1,
    )
    default_class: str = DEFAULT_SLO_CLASS
    # requests predicted to miss everywhere wait (while their TTFT lasts) up to this many
    max_held: int = Field(default=1024, ge=0)
    # $/hour per GPU type for the cost score (defaults: router/core/policies/slo_aware.py)
    gpu_prices: GpuPrices = Field(default_factory=dict)
    cost_weight: float = Field(default=0.1, ge=0)
    margin: float = Field(default=0.9, gt=0, le=1)  # a backend fits when predicted <= margin x SLO
    # the latency model starts from the roofline priors times this (engines known to run
    # slower than the roofline, or a testbed's slowed-down engines); it learns from there
    prior_scale: float = Field(default=1.0, gt=0, le=100)
    # true only where clients' max_tokens is what they generate (ignore_eos batch jobs,
    # evals): then each stream is protected from later prefills' stalls (the stall guard)
    max_tokens_is_output: bool = False

    @model_validator(mode="after")
    def _default_is_a_class(self) -> SloConfig:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError("slo.classes names must be distinct")
        if self.default_class not in names:
            raise ValueError(f"slo.default_class {self.default_class!r} is not one of {names}")
        return self


class RouterConfig(AdminAccess, DeclaresGpuTypes):
    listen: ListenConfig = ListenConfig()
    # /metrics and /admin/* (which show the fleet's topology) live on this listener, by
    # default on loopback only; admin_on_public_listener puts them on the public listener
    # instead, which is allowed only while that one is bound to loopback.
    admin_listen: ListenConfig = ListenConfig(port=9090)
    admin_on_public_listener: bool = False
    # other paths forwarded to engines (exact), after the key, quota and queue checks
    passthrough_paths: list[str] = Field(default_factory=list)
    # sent to engines as `Authorization: Bearer ...` (clients' keys never are)
    engine_api_key: str | None = None
    engine_api_key_file: str | None = None
    engine_api_key_env: str | None = None
    check_secret_forms = secret_forms("engine_api_key")
    # for https:// engine URLs: the CA to trust and, for mutual TLS, the router's certificate
    engine_tls: ClientTlsConfig = ClientTlsConfig()
    engine_headers: list[str] = Field(default_factory=list)  # besides headers.ENGINE_HEADERS
    # CIDRs of proxies in front (the global tier, a load balancer) whose X-Forwarded-For
    # names the client; that client, not the proxy, is counted against per-client limits
    trusted_proxies: list[str] = Field(default_factory=list)
    expose_backend_header: bool = False  # x-gpuroute-backend on answers: tests, benchmarks
    policy: PolicyName = DEFAULT_POLICY
    # each policy's settings table, `[policy_settings.<name>]` (docs/configuration.md); checked
    # against the policy's Settings whichever policy is chosen (a reload may switch)
    policy_settings: dict[str, dict[str, Any]] = Field(default_factory=dict)
    model_shape: str = "llama-3.1-8b"  # seeds the cost priors; learned online after that
    # served models' shapes, aliases, canary splits and fallbacks (router/config/models.py)
    models: list[RouterModelConfig] = Field(default_factory=list)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    decision_log_sample: float = Field(default=0.0, ge=0, le=1)
    # decisions, holds, refusals and failed attempts kept for /admin/explain (0: none)
    decision_log_keep: int = Field(default=2000, ge=0, le=1_000_000)
    tick_s: float = Field(default=0.5, gt=0)
    health_check_path: str = "/health"  # active checks, and probes of a half-open breaker
    health: HealthCheckConfig = HealthCheckConfig()
    limits: LimitsConfig = LimitsConfig()
    retry: RetryConfig = RetryConfig()
    admission: AdmissionConfig = AdmissionConfig()
    slo: SloConfig = SloConfig()
    breaker: BreakerConfig = BreakerConfig()
    outlier: OutlierConfig = OutlierConfig()
    membership: MembershipConfig = MembershipConfig()
    region: RegionConfig = RegionConfig()
    auth: AuthConfig = AuthConfig()
    redis: RedisConfig = RedisConfig()
    responses: ResponsesConfig = ResponsesConfig()  # the Responses API's stored state
    workers: WorkersConfig = WorkersConfig()
    access_log: AccessLogConfig = AccessLogConfig()  # one line per answered request
    tracing: TracingConfig = TracingConfig()  # OTLP spans (gpuroute/tracing.py); off
    metrics: MetricsConfig = MetricsConfig()  # label cardinality (router/config/metrics.py)
    usage: UsageConfig = UsageConfig()  # per-tenant usage records (router/usage/records.py)
    continuation: ContinuationConfig = ContinuationConfig()  # broken streams go on elsewhere
    rebalance: RouterRebalanceConfig = RouterRebalanceConfig()  # simulated only (off)
    autoscale: AutoscaleConfig = AutoscaleConfig()  # pools' desired sizes, warm standby
    backends: list[BackendConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _admin_placement(self) -> RouterConfig:
        admin_placement(self.listen, self.admin_on_public_listener, self.admin_listen, self)
        if self.workers.count != 1 and self.admin_on_public_listener:
            raise ValueError(
                "workers.count: several workers need admin_listen (on the public listener "
                "/metrics would show whichever worker took the connection)"
            )
        return self

    @field_validator("engine_headers")
    @classmethod
    def _engine_headers(cls, names: list[str]) -> list[str]:
        return [engine_header(name) for name in names]

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        for cidr in cidrs:
            ipaddress.ip_network(cidr, strict=False)  # ValueError names the bad one
        return cidrs

    @field_validator("passthrough_paths")
    @classmethod
    def _passthrough_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or ".." in path or "{" in path or path.endswith("/"):
                raise ValueError(f"{path!r}: expected an exact path like /v1/load_lora_adapter")
            if path in API_ROUTES or path == "/v1/models":
                raise ValueError(f"{path!r} is an API the router serves and schedules itself")
            if path.startswith(("/admin", "/metrics", "/_")):
                raise ValueError(f"{path!r}: admin and internal paths are never forwarded")
        return paths

    @model_validator(mode="after")
    def _keys_usable(self) -> RouterConfig:
        """Each key's class, SLO class and residency mean something here (the admin API's
        keys are checked alike: `key_problem`)."""
        auth = self.auth
        for name, key in (("auth.anonymous", auth.anonymous), *(
            (f"auth.keys[{i}]", k) for i, k in enumerate(auth.keys)
        )):  # fmt: skip
            if problem := key_problem(key, *self.key_context()):
                raise ValueError(f"{name}.{problem[0]}: {problem[1]}")
        return self

    def key_context(self) -> tuple[list[str], list[str], bool]:
        """What a key is checked against: the priorities, the SLO classes, and whether the
        router knows its place (for residency)."""
        placed = self.region.name != "local" or self.region.jurisdiction is not None
        return self.admission.priorities, [c.name for c in self.slo.classes], placed

    @model_validator(mode="after")
    def _has_backends(self) -> RouterConfig:
        if not self.backends and not self.membership.consul:
            raise ValueError("list [[backends]] or set membership.consul to discover them")
        return self

    @field_validator("backends")
    @classmethod
    def _unique_ids(cls, backends: list[BackendConfig]) -> list[BackendConfig]:
        seen: set[str] = set()
        for b in backends:
            if b.backend_id in seen:
                raise ValueError(f"duplicate backend id {b.backend_id!r}")
            seen.add(b.backend_id)
        return backends

    @model_validator(mode="after")
    def _models_table(self) -> RouterConfig:
        served = None if self.membership.consul else frozenset(
            m for b in self.backends for m in b.models
        )  # fmt: skip
        check_models(self.models, served)
        slo_classes = {c.name for c in self.slo.classes}
        for i, m in enumerate(self.models):
            if m.slo_class is not None and m.slo_class not in slo_classes:
                raise ValueError(f"models[{i}].slo_class: {m.slo_class!r} is no [[slo.classes]]")
        return self

    @model_validator(mode="after")
    def _policy_settings(self) -> RouterConfig:
        """Each `[policy_settings.<name>]` names a policy and holds its settings, each set
        once (there, or under its older key)."""
        for name, table in self.policy_settings.items():
            check_policy_table(name, table, "policy_settings")
            self.policy_table(name)  # a setting set twice (there, and under its older key)
        return self

    def _older_policy_keys(self, name: str, workers: int) -> dict[str, OlderKey]:
        """The settings of policy `name` that keys older than `[policy_settings]` give."""
        if name == "slo_aware":
            slo, named = self.slo, self.slo.model_fields_set
            return {
                "cost_weight": OlderKey("slo.cost_weight", slo.cost_weight, "cost_weight" in named),
                "margin": OlderKey("slo.margin", slo.margin, "margin" in named),
            }
        redis = self.redis
        shared = redis.configured and redis.share_load
        if name == "least_outstanding_work" and (shared or workers > 1):
            # set in both places is an error only where the file itself shares the load
            # (redis): the workers may come from --workers, which the file's check does not
            # see, and then the table's pick_among wins
            named = shared and "pick_among" in redis.model_fields_set
            return {"pick_among": OlderKey("redis.pick_among", redis.pick_among, named)}
        return {}

    def policy_table(self, name: str, workers: int = 1) -> dict[str, object]:
        """The settings table policy `name` is built with: its `[policy_settings.<name>]`
        over what older keys say (slo.cost_weight and slo.margin of slo_aware; redis.pick_among
        of least outstanding work while replicas or workers share their load)."""
        older = self._older_policy_keys(name, workers)
        return settings_table(name, self.policy_settings.get(name, {}), older, "policy_settings")

    def shapes(self) -> dict[str, ModelSpec]:
        """Each served model name's shape (and each built-in's, by its own name)."""
        return MODELS | shapes(self.models, self.model_shape, MODELS)

    @field_validator("model_shape")
    @classmethod
    def _known_shape(cls, value: str) -> str:
        return known_name(value, MODELS, "model shape")


def load_router_config(path: Path | str) -> RouterConfig:
    return load_toml_model(path, RouterConfig)
