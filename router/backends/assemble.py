"""How a router's scheduler is assembled from its config: backends, health, cost and latency
priors, and the policy."""

from __future__ import annotations

from collections.abc import Callable

from gpuroute.router.backends.priors import PriorBook
from gpuroute.router.config.metrics import BoundedLabels
from gpuroute.router.config.router import BackendConfig, RouterConfig
from gpuroute.router.core.backend import Backend, BackendSet
from gpuroute.router.core.breaker import BreakerSettings
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.health import BackendHealth
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.membership import Member
from gpuroute.router.core.model_routes import ModelRoutes
from gpuroute.router.core.outlier import OutlierSettings
from gpuroute.router.core.policies import Policy, PolicyFacts, build_policy
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.observe.metrics import RouterMetrics

from gpuroute.config import ConfigError
from gpuroute.roofline import EngineKind


def prior_book(config: RouterConfig) -> PriorBook:
    """The priors of every engine kind the config names (others are added as they join)."""
    prices = dict(config.slo.gpu_prices)
    return PriorBook(config.gpu_catalog().with_prices(prices), config.shapes(), config.model_shape)


def engine_kind(book: PriorBook, gpu: str, models, tp: int = 1, pp: int = 1) -> EngineKind:
    return EngineKind(gpu, book.shape_of(models), tp, pp)


def static_backend(book: PriorBook, b: BackendConfig, i: int) -> Backend:
    """One `[[backends]]` entry as the scheduler holds it (ConfigError naming it)."""
    kind = engine_kind(book, b.gpu, b.models, b.tensor_parallel, b.pipeline_parallel)
    try:
        key = book.ensure(kind)
    except ValueError as exc:
        raise ConfigError(f"backends[{i}] ({b.backend_id}): {exc}") from None
    capacity = b.capacity if b.capacity is not None else book.table[key].capacity
    return Backend(
        b.backend_id, key, b.models, capacity=capacity, address=b.url, gpu=b.gpu,
        gpus=kind.gpus, lora_models=b.lora_adapters,
    )  # fmt: skip


def configured_policy(config: RouterConfig, book: PriorBook, workers: int = 1) -> Policy:
    """The configured policy with its settings table (also on reload) and the GPU prices
    the book holds (declared [[gpu_types]] and [slo] gpu_prices)."""
    prices = {n: s.price_per_hour for n, s in book.gpus.items() if s.price_per_hour}
    table = config.policy_table(config.policy, workers)
    return build_policy(config.policy, table, PolicyFacts(prices))


def build_scheduler(config: RouterConfig, book: PriorBook, workers: int = 1) -> Scheduler:
    backends = BackendSet()
    for i, b in enumerate(config.backends):
        backends.add(static_backend(book, b, i))
    priors = book.table
    health = BackendHealth(
        backends,
        BreakerSettings(**config.breaker.model_dump()),
        OutlierSettings(**config.outlier.model_dump()),
        active_probes=True,
    )
    costs = {gpu: p.cost for gpu, p in priors.items()}
    estimator = CostEstimator(costs, exact_max_tokens=config.slo.max_tokens_is_output)
    slo = config.slo
    latency = LatencyModel({gpu: p.latency.scaled(slo.prior_scale) for gpu, p in priors.items()})
    policy = configured_policy(config, book, workers)
    scheduler = Scheduler(backends, policy, estimator, health, latency)
    scale = slo.prior_scale
    # a kind first seen at run time (a member that joined) brings its priors
    book.listeners.append(lambda kind, p: scheduler.add_kind(kind, p.cost, p.latency.scaled(scale)))
    return scheduler


def router_metrics(
    config: RouterConfig, scheduler: Scheduler, routes: ModelRoutes, redis: bool
) -> RouterMetrics:
    """The router's metrics, watching its backends. Model labels name the models it knows:
    served by a backend (static or joined) or named in its routes (as reloaded)."""
    backends = scheduler.backends

    def knows(model: str) -> bool:
        return backends.serves(model) or model in routes.aliases or model in routes.routes

    bounds = config.metrics
    metrics = RouterMetrics(
        BoundedLabels(bounds.max_models, knows), BoundedLabels(bounds.max_tenants)
    )
    metrics.watch_backends(backends, scheduler.health, scheduler.latency)
    metrics.redis_configured.labels("quotas").set(float(redis))
    metrics.redis_configured.labels("load").set(float(redis and config.redis.share_load))
    return metrics


def member_kind(book: PriorBook) -> Callable[[Member], str]:
    """A member's engine kind key, its priors computed if it is the first of its kind
    (ValueError when its model does not fit its GPUs)."""
    return lambda m: book.ensure(engine_kind(book, m.gpu, m.models, m.tp, m.pp))
