"""Sans-IO scheduling core: every function takes `now` and `rng`, none does I/O.

The live router and the fleet simulator drive the same objects from here."""

from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.cost import CostEstimator, GpuCostPrior
from gpuroute.router.core.ledger import OutstandingWork
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.scheduler import Decision, Scheduler

__all__ = [
    "Backend",
    "BackendSet",
    "BackendState",
    "CostEstimator",
    "Decision",
    "GpuCostPrior",
    "OutstandingWork",
    "RequestInfo",
    "Scheduler",
]
