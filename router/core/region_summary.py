"""What a regional router tells the global tier about its region (pure).

Work ahead of a new request on a backend is its outstanding work (this router's ledger plus
other routers' work seen through the agent) divided by its capacity. The region's expected
queueing delay is total work over total capacity; its utilisation is that delay against
`saturation_delay_s`, the work ahead at which a region counts as full (1.0)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuroute.router.core.backend import ROUTABLE_STATES, Backend


@dataclass(frozen=True, slots=True)
class RegionSummary:
    utilisation: float
    queue_delay_s: float
    routable_backends: int
    capacity: float
    models: tuple[str, ...]


def summarise(backends: Iterable[Backend], saturation_delay_s: float) -> RegionSummary:
    routable = [b for b in backends if b.state in ROUTABLE_STATES]
    capacity = sum(b.capacity for b in routable)
    if capacity <= 0:
        return RegionSummary(0.0, 0.0, 0, 0.0, ())
    work = sum(b.outstanding + b.external for b in routable)
    delay = work / capacity
    models = tuple(sorted({m for b in routable for m in b.models}))
    return RegionSummary(delay / saturation_delay_s, delay, len(routable), capacity, models)
