"""What the router's admin listener shows of its fleet (`GET /admin/backends`)."""

from __future__ import annotations

from gpuroute.router.config import RouterConfig
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.membership import Membership


def describe_backends(
    scheduler: Scheduler, config: RouterConfig, membership: Membership | None, now: float
) -> dict:
    """Each backend's state as the scheduler sees it, and the membership's freshness."""
    rows = []
    for backend in scheduler.backends:
        row = _row(scheduler, backend)
        if membership is not None and (extra := membership.describe(backend.backend_id)):
            row.update(extra)
        rows.append(row)
    body: dict = {"policy": config.policy, "backends": rows}
    if membership is not None:
        body["membership"] = {
            "consul": config.membership.consul,
            "stale": membership.stale,
            "members": len(membership.members),
            "since_sync_s": None
            if membership.last_sync is None
            else round(now - membership.last_sync, 3),
        }
    return body


def _row(scheduler: Scheduler, b: Backend) -> dict:
    health = scheduler.health
    return {
        "id": b.backend_id,
        "url": b.address,
        "gpu": b.gpu_type,
        "models": sorted(b.models),
        "capacity": round(b.capacity, 4),
        "state": b.state.value,
        "reason": b.reason,
        "in_flight": b.in_flight,
        "outstanding_s": round(b.outstanding, 4),
        "slowness": round(b.slowness, 3),
        "shared_s": round(b.shared, 4),
        "breaker": health.breaker(b.backend_id).state.value,
        "ejected": health.outliers.is_ejected(b.backend_id),
    }
