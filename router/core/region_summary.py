"""What a regional router tells the global tier about its region (pure).

Work ahead is the region's outstanding work (this router's ledger plus other routers' work
seen through the agents) over its capacity. With continuous batching most of it runs
concurrently, so it becomes waiting only beyond `saturation_delay_s`, the work ahead of a
region at full load (calibrate it for the workload: it grows with batch size and request
cost). Utilisation is work ahead / saturation (1.0 = full); the expected queueing delay is
the excess."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuroute.router.core.backend import ROUTABLE_STATES, Backend
from gpuroute.router.core.model_routes import ModelRoutes


@dataclass(frozen=True, slots=True)
class RegionSummary:
    utilisation: float
    queue_delay_s: float
    routable_backends: int
    capacity: float
    models: tuple[str, ...]  # served by routable backends (and the names routes give them)
    known: tuple[str, ...] = ()  # every model a backend in any state serves, and its names


def summarise(
    backends: Iterable[Backend],
    saturation_delay_s: float,
    verified: Callable[[Backend], bool] = lambda _backend: True,
    routes: ModelRoutes | None = None,
) -> RegionSummary:
    """`verified` leaves out backends the router cannot vouch for yet (e.g. a stale catalog
    entry whose agent is not streaming), so a restarting region does not claim capacity.
    The models are those served, and the names `routes` answers with them (aliases, a
    split's name, a model served by its fallback), which clients send to the global tier."""
    backends = list(backends)
    known = _named({m for b in backends for m in b.models}, routes)
    routable = [b for b in backends if b.state in ROUTABLE_STATES and verified(b)]
    capacity = sum(b.capacity for b in routable)
    if capacity <= 0:
        return RegionSummary(0.0, 0.0, 0, 0.0, (), known)
    work = sum(b.outstanding + b.external for b in routable)
    ahead = work / capacity
    models = _named({m for b in routable for m in b.models}, routes)
    wait = max(0.0, ahead - saturation_delay_s)
    return RegionSummary(ahead / saturation_delay_s, wait, len(routable), capacity, models, known)


def _named(served: set[str], routes: ModelRoutes | None) -> tuple[str, ...]:
    """The models and every name `routes` answers with them, sorted."""
    names = routes.reachable(served) if routes is not None else frozenset()
    return tuple(sorted(served | names))
