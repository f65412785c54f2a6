"""Global tier configuration (TOML), validated with errors that name the file and the key."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

from gpuroute.global_.core.policy import MODES
from gpuroute.global_.core.residency import ANY, ResidencyRules
from pydantic import AfterValidator, Field, field_validator, model_validator

from gpuroute.access_log import AccessLogConfig
from gpuroute.admin_guard import AdminAccess, admin_placement
from gpuroute.config import (
    ConfigError,
    HttpUrl,
    LimitsConfig,
    ListenConfig,
    StrictModel,
    known_name,
    load_toml_model,
)
from gpuroute.continuation.text import ContinuationConfig
from gpuroute.regions import FleetConfig, load_fleet
from gpuroute.residency_decision import DEFAULT_TTL_S, MAX_TTL_S
from gpuroute.secrets import secret_forms
from gpuroute.tls import ClientTlsConfig
from gpuroute.tracing import TracingConfig

Mode = Annotated[str, AfterValidator(lambda v: known_name(v, MODES, "global policy"))]


class EndpointConfig(StrictModel):
    """A regional router: where to forward, and where its region reports stream from."""

    region: str
    url: HttpUrl
    report: str  # host:port of its RegionLoad gRPC service


class SpilloverConfig(StrictModel):
    start: float = Field(default=0.85, gt=0)
    stop: float = Field(default=0.75, gt=0)
    full: float = Field(default=1.0, gt=0)
    max_fraction: float = Field(default=0.9, gt=0, le=1)


class RegionHealthConfig(StrictModel):
    stale_after_s: float = Field(default=2.0, gt=0)
    down_after_failures: int = Field(default=3, ge=1)
    up_after_s: float = Field(default=5.0, ge=0)


class ResidencyConfig(StrictModel):
    tenants: dict[str, list[str]] = Field(default_factory=dict)  # tenant -> jurisdictions
    countries: dict[str, list[str]] = Field(default_factory=dict)  # ISO country -> jurisdictions
    # clients GeoIP cannot place; ["*"] = no constraint, e.g. ["eu"] to fail closed
    unknown_country: list[str] = Field(default_factory=lambda: ["*"])
    api_keys: dict[str, str] = Field(default_factory=dict)  # sha256(key) hex -> tenant
    # with api_keys set, requests without a key are refused (401) unless this is true
    allow_anonymous: bool = False
    # true: api_keys lists every key, so one not in it is refused (401) here, before its
    # body is read; false: a key without residency rules passes to the routers, which
    # authenticate it
    refuse_unknown_keys: bool = False
    # tenant -> the models its keys may ask for, as clients name them (a router's
    # [[auth.keys]] models then applies its aliases, splits and fallbacks); `anonymous`:
    # keyless callers'. A tenant not listed: every model here, its router decides.
    tenant_models: dict[str, list[str]] = Field(default_factory=dict)
    # signs each request's decision for the region (routers' region.decision_key)
    decision_key: str | None = None
    decision_key_file: str | None = None
    decision_key_env: str | None = None
    check_secret_forms = secret_forms("decision_key")
    # how long a signed decision is good for; routers check it on arrival, once
    decision_ttl_s: float = Field(default=DEFAULT_TTL_S, gt=0, le=MAX_TTL_S)

    @field_validator("tenant_models")
    @classmethod
    def _model_lists(cls, lists: dict[str, list[str]]) -> dict[str, list[str]]:
        for tenant, models in lists.items():
            if not models:  # LiteLLM reads [] as every model, a reader as none
                raise ValueError(f"{tenant}: list the models, or leave the tenant out for all")
        return lists

    @field_validator("api_keys")
    @classmethod
    def _hashes(cls, keys: dict[str, str]) -> dict[str, str]:
        for digest in keys:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{digest[:12]}...: expected a lowercase sha256 hex digest")
        return keys


class DiscoveryConfig(StrictModel):
    """Find regional routers through Consul: each region is a WAN-federated datacenter named
    after it, where routers register as `gpuroute-router`. [[endpoints]] stay the fallback."""

    consul: str | None = None  # the global router's local Consul agent
    token: str | None = None
    token_file: str | None = None
    token_env: str | None = None
    check_secret_forms = secret_forms("token")
    service: str = "gpuroute-router"
    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=3.0, gt=0)


class GlobalConfig(AdminAccess):
    regions_file: str = "regions.example.toml"  # relative to this file
    policy: Mode = "ours"
    geoip_database: str | None = None  # GeoIP2/GeoLite2 City .mmdb; unset: clients unplaced
    trusted_proxies: list[str] = Field(default_factory=list)  # CIDRs whose X-Forwarded-For counts
    drain_timeout_s: float = Field(default=30.0, ge=0)
    tick_s: float = Field(default=0.25, gt=0)
    decision_log_sample: float = Field(default=0.0, ge=0, le=1)
    listen: ListenConfig = ListenConfig(port=8090)
    admin_listen: ListenConfig = ListenConfig(port=9091)  # metrics, admin; loopback
    admin_on_public_listener: bool = False  # only while listen.host is loopback
    limits: LimitsConfig = LimitsConfig()
    access_log: AccessLogConfig = AccessLogConfig()  # one line per answered request
    spillover: SpilloverConfig = SpilloverConfig()
    region_health: RegionHealthConfig = RegionHealthConfig()
    residency: ResidencyConfig = ResidencyConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    # for https:// router URLs: the CA to trust and, for mutual TLS, this tier's certificate
    router_tls: ClientTlsConfig = ClientTlsConfig()
    report_tls: ClientTlsConfig | None = None  # (m)TLS to the routers' region reports
    tracing: TracingConfig = TracingConfig()  # OTLP spans (gpuroute/tracing.py); off
    # a stream whose region breaks mid-answer goes on in another allowed region
    continuation: ContinuationConfig = ContinuationConfig()

    @model_validator(mode="after")
    def _admin_placement(self) -> GlobalConfig:
        admin_placement(self.listen, self.admin_on_public_listener, self.admin_listen, self)
        return self


def _set(values: list[str]) -> frozenset[str]:
    return ANY if values == ["*"] else frozenset(v.lower() for v in values)


def compile_residency(config: ResidencyConfig, fleet: FleetConfig) -> ResidencyRules:
    return ResidencyRules(
        jurisdictions=frozenset(r.jurisdiction for r in fleet.regions),
        tenants={t: _set(v) for t, v in config.tenants.items()},
        countries={c: _set(v) for c, v in config.countries.items()},
        unknown_country=_set(config.unknown_country),
    )


def load_global_config(path: Path | str) -> tuple[GlobalConfig, FleetConfig, ResidencyRules]:
    """The config, the fleet it points to and its compiled residency rules; every problem
    (unknown region, unknown jurisdiction, missing GeoIP database) names file and key."""
    path = Path(path)
    config = load_toml_model(path, GlobalConfig)
    fleet = load_fleet(path.parent / config.regions_file)
    names = {r.name for r in fleet.regions}
    known = ", ".join(sorted(names))
    problems = [
        f"{path}: endpoints[{i}].region: unknown region {e.region!r}; known: {known}"
        for i, e in enumerate(config.endpoints)
        if e.region not in names
    ]
    if not config.endpoints and not config.discovery.consul:
        problems.append(f"{path}: endpoints: list [[endpoints]] or set discovery.consul")
    rules = compile_residency(config.residency, fleet)
    problems += [f"{path}: {p}" for p in rules.check()]
    if config.geoip_database is not None:
        db = path.parent / config.geoip_database
        if not db.is_file():
            problems.append(f"{path}: geoip_database: {db} not found")
    for i, cidr in enumerate(config.trusted_proxies):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            problems.append(f"{path}: trusted_proxies[{i}]: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
    return config, fleet, rules
