"""Metrics the request path feeds without prometheus_client's per-call locks: counts and
observations kept in plain Python and handed to the real children, all at once, before the
registry is collected (a scrape, a test's read). What a scrape shows is the same."""

from __future__ import annotations

import bisect

from prometheus_client.metrics import MetricWrapperBase


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
