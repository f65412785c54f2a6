"""How loaded a backend is, as policies compare backends: four estimators.

Each is a function of the pick's context (PickContext, read at its `now`) and a backend
giving a comparable number, lower is less loaded, without changing anything. Every policy
that weighs load imports the estimator it uses instead of writing its own formula. They are
four because they rank backends differently (they are not interchangeable: swapping one for
another changes decisions):
- `in_flight_share`: requests in flight per capacity (power of two choices compares two);
- `connection_share`: the same counting this request (HAProxy's weighted `leastconn`);
  against `in_flight_share` it prefers the larger of two idle backends;
- `request_share`: `connection_share` with other routers' work counted at this request's
  cost and stretched by slowness (slo_aware ranks a GPU type's draws by it);
- `work_seconds`: seconds until the backend would finish its work and this request
  (least outstanding work, prefix affinity)."""

from __future__ import annotations

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext


def in_flight_share(ctx: PickContext, backend: Backend) -> float:
    """Requests in flight there per unit of (warm-up reduced) capacity."""
    return backend.in_flight / ctx.capacity_of(backend)


def connection_share(ctx: PickContext, backend: Backend) -> float:
    """In flight per capacity once this request is there too."""
    return (backend.in_flight + 1) / ctx.capacity_of(backend)


def request_share(ctx: PickContext, backend: Backend) -> float:
    """In flight per capacity counting other routers' requests there (the agent's report or
    the peers' shared ledger, in seconds of work) at this request's cost, stretched like
    `work_seconds` by how much slower than expected it runs."""
    others = backend.others_work
    if others > 0:
        others /= max(ctx.cost_on(backend), 1e-6)
    return (backend.in_flight + 1 + others) * backend.slowness / ctx.capacity_of(backend)


def work_seconds(ctx: PickContext, backend: Backend, cost: float | None = None) -> float:
    """Seconds until the backend would finish its outstanding work plus this request (its
    `cost` there: by default the estimator's), stretched by how much slower than expected it
    has been running and by its warm-up."""
    if cost is None:
        cost = ctx.cost_on(backend)
    work = backend.outstanding + backend.others_work + cost
    return work * backend.slowness / ctx.warmup_factor(backend)
