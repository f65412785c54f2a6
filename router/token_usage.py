"""Token-level truth: what each request used, as its engine counted it (the usage it
reports, streams included: router/stream_usage.py), read once at the end of the request
and counted in `gpuroute_tokens_total{model,tenant,direction}`. Tenants beyond the first
`[metrics] max_tenants` seen are folded into `other`, so the series stay bounded."""

from __future__ import annotations

from gpuroute.router.metrics import Children, RouterMetrics
from prometheus_client import Counter
from pydantic import Field

from gpuroute.config import StrictModel

OTHER = "other"


class MetricsConfig(StrictModel):
    """The `[metrics]` section: label cardinality."""

    max_tenants: int = Field(default=50, ge=0)  # tenants named in labels; the rest: `other`


class UsageConfig(StrictModel):
    """The `[usage]` section: per-tenant usage records for billing (router/usage_records.py)."""

    enabled: bool = True
    # how often a replica adds what it counted to Redis's hourly records (and on shutdown)
    flush_interval_s: float = Field(default=5.0, gt=0, le=3600)
    retention_days: float = Field(default=40.0, gt=0, le=732)  # hours older are dropped


class TenantLabels:
    """A tenant's label: its name for the first `limit` tenants seen, else `other`."""

    __slots__ = ("limit", "named")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.named: set[str] = set()

    def __call__(self, tenant: str) -> str:
        if tenant in self.named:
            return tenant
        if len(self.named) < self.limit and tenant != OTHER:
            self.named.add(tenant)
            return tenant
        return OTHER


class TokenCounter:
    """`gpuroute_tokens_total`, in the router's registry."""

    def __init__(self, metrics: RouterMetrics, config: MetricsConfig) -> None:
        self.tenant_label = TenantLabels(config.max_tenants)
        self.tokens = Counter(
            "gpuroute_tokens",
            "Tokens as the engines' usage reports them, by served model, tenant (beyond "
            "[metrics] max_tenants: other) and direction (prompt, completion).",
            ["model", "tenant", "direction"],
            registry=metrics.registry,
        )
        self.tokens_by = Children(self.tokens)

    def count(self, model: str, tenant: str, prompt: int, completion: int) -> None:
        label = self.tenant_label(tenant)
        if prompt:
            self.tokens_by(model, label, "prompt").inc(prompt)
        if completion:
            self.tokens_by(model, label, "completion").inc(completion)
