"""Label cardinality: the values the router's metrics may carry in their `tenant` and
`model` labels. Tenants beyond the first `[metrics] max_tenants` seen are folded into
`other`; a model is named only when the router knows it (configured, an alias or routed
name, or served by a backend), for the first `[metrics] max_models` such models seen, so a
client's made-up names never become series."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field

from gpuroute.config import StrictModel

OTHER = "other"


class MetricsConfig(StrictModel):
    """The `[metrics]` section: label cardinality."""

    max_tenants: int = Field(default=50, ge=0)  # tenants named in labels; the rest: `other`
    max_models: int = Field(default=100, ge=0)  # known models named in labels; the rest: `other`


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


class ModelLabels:
    """A model's label: its name when `knows` it, for the first `limit` such names seen;
    "" for a request refused before it named one; else `other`. A name once named stays
    (one set lookup on the request path); an unknown one is asked about again, so a model
    that joins later is named from then on."""

    __slots__ = ("knows", "limit", "named")

    def __init__(self, knows: Callable[[str], bool], limit: int) -> None:
        self.knows, self.limit = knows, limit
        self.named: set[str] = set()

    def __call__(self, model: str) -> str:
        if model in self.named or not model:
            return model
        if len(self.named) < self.limit and model != OTHER and self.knows(model):
            self.named.add(model)
            return model
        return OTHER
