"""How a router's scheduler is assembled from its config: backends, health, cost and latency
priors, and the policy."""

from __future__ import annotations

from gpuroute.router.config import RouterConfig
from gpuroute.router.core.backend import Backend, BackendSet
from gpuroute.router.core.breaker import BreakerSettings
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.health import BackendHealth
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.outlier import OutlierSettings
from gpuroute.router.core.policies import PolicyOptions, build_policy
from gpuroute.router.core.scheduler import Scheduler

from gpuroute.config import ConfigError


def build_scheduler(config: RouterConfig, priors, workers: int = 1) -> Scheduler:
    backends = BackendSet()
    for b in config.backends:
        if b.gpu not in priors:
            raise ConfigError(
                f"backend {b.backend_id}: model {config.model_shape} does not fit {b.gpu}"
            )
        capacity = b.capacity if b.capacity is not None else priors[b.gpu].capacity
        backends.add(Backend(b.backend_id, b.gpu, b.models, capacity=capacity, address=b.url))
    health = BackendHealth(
        backends,
        BreakerSettings(**config.breaker.model_dump()),
        OutlierSettings(**config.outlier.model_dump()),
        active_probes=True,
    )
    costs = {gpu: p.cost for gpu, p in priors.items()}
    estimator = CostEstimator(costs, exact_max_tokens=config.slo.max_tokens_is_output)
    sharing = (config.redis.configured and config.redis.share_load) or workers > 1
    slo = config.slo
    options = PolicyOptions(
        pick_among=config.redis.pick_among if sharing else 1,
        gpu_prices=slo.gpu_prices or None,
        cost_weight=slo.cost_weight,
        slo_margin=slo.margin,
    )
    latency = LatencyModel({gpu: p.latency.scaled(slo.prior_scale) for gpu, p in priors.items()})
    policy = build_policy(config.policy, options)
    return Scheduler(backends, policy, estimator, health, latency)
