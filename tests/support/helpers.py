"""Small builders for core tests."""

from __future__ import annotations

import random
from collections.abc import Sequence

from gpuroute.router.core import Backend, BackendSet, CostEstimator, GpuCostPrior, RequestInfo
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies import PickContext

PRIORS = {
    "H100": GpuCostPrior(prefill_s_per_token=1e-4, decode_s_per_token=1e-3),
    "L4": GpuCostPrior(prefill_s_per_token=4e-4, decode_s_per_token=4e-3),
}


def backends(n: int, gpu: str = "H100", model: str = "m", **kw) -> list[Backend]:
    return [Backend(f"b{i}", gpu, (model,), **kw) for i in range(n)]


def context(
    pool: BackendSet | Sequence[Backend],
    request: RequestInfo | None = None,
    *,
    now: float = 0.0,
    seed: int = 1,
    estimator: CostEstimator | None = None,
) -> PickContext:
    backend_set = pool if isinstance(pool, BackendSet) else BackendSet(pool)
    return PickContext(
        request or RequestInfo(1, "m", 100, 10),
        backend_set,
        estimator or CostEstimator(PRIORS),
        now,
        random.Random(seed),
    )


def shares(picks: Sequence[Backend], pool: Sequence[Backend]) -> list[float]:
    counts = {b.backend_id: 0 for b in pool}
    for backend in picks:
        counts[backend.backend_id] += 1
    return [counts[b.backend_id] / len(picks) for b in pool]


def life(info: RequestInfo, tried: Sequence[str] = ()) -> RequestLifetime:
    """A request's lifetime, as the scheduler books it (`tried`: backends it went to)."""
    lifetime = RequestLifetime(info)
    lifetime.tried.update(tried)
    return lifetime
