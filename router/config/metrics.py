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


class BoundedLabels:
    """A label's value: the name itself for the first `limit` names seen (where `knows` is
    given, only names it knows: a client's made-up model is never one), "" as it is, and
    anything else `other`. A name once named stays (one set lookup on the request path); an
    unknown one is asked about again, so a model that joins later is named from then on."""

    __slots__ = ("knows", "limit", "named")

    def __init__(self, limit: int, knows: Callable[[str], bool] | None = None) -> None:
        self.knows, self.limit = knows, limit
        self.named: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self.named or not name:
            return name
        room = len(self.named) < self.limit and name != OTHER
        if room and (self.knows is None or self.knows(name)):
            self.named.add(name)
            return name
        return OTHER
