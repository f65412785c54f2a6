"""What every gpuroute process exports beside its tier's metrics: the process's own figures
(`process_*`: CPU seconds, resident memory, open file descriptors, start time) and
`gpuroute_build_info{version, python, tier}` = 1, which a dashboard joins on to show what
runs where. Counters export no `_created` series (a second series per counter that no
query here reads)."""

from __future__ import annotations

import platform
from importlib import metadata

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

# a request's seconds, arrival to last byte, in every tier's histograms (so they compare)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


def gpuroute_version() -> str:
    try:
        return metadata.version("gpuroute")
    except metadata.PackageNotFoundError:  # run from a source tree without installing it
        return "unknown"


def register_process_metrics(registry: CollectorRegistry, tier: str) -> None:
    """Adds them to a tier's registry. prometheus_client's `_created` switch is the
    process's (the library keeps it module-wide); every gpuroute process wants it off."""
    prometheus_client.disable_created_metrics()
    ProcessCollector(registry=registry)
    info = Gauge(
        "gpuroute_build_info", "1, labelled with what this process runs.",
        ["version", "python", "tier"], registry=registry,
    )  # fmt: skip
    info.labels(gpuroute_version(), platform.python_version(), tier).set(1)
