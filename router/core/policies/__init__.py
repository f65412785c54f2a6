"""Load-balancing policies, one module each, all behind `Policy` (see base.py)."""

from __future__ import annotations

from collections.abc import Callable

from gpuroute.router.core.policies.base import PickContext, Policy
from gpuroute.router.core.policies.least_connections import LeastConnections
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.policies.p2c import PowerOfTwoChoices
from gpuroute.router.core.policies.prefix_affinity import PrefixAffinity
from gpuroute.router.core.policies.random_pick import RandomPick
from gpuroute.router.core.policies.round_robin import RoundRobin
from gpuroute.router.core.policies.session_affinity import SessionAffinity
from gpuroute.router.core.policies.weighted_round_robin import WeightedRoundRobin

POLICIES: dict[str, Callable[[], Policy]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        RandomPick,
        LeastConnections,
        WeightedRoundRobin,
        PowerOfTwoChoices,
        LeastOutstandingWork,
        PrefixAffinity,
        SessionAffinity,
    )
}
DEFAULT_POLICY = LeastOutstandingWork.name


def build_policy(name: str) -> Policy:
    """A fresh policy instance by name; unknown names list the known ones."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory()


__all__ = ["DEFAULT_POLICY", "POLICIES", "PickContext", "Policy", "build_policy"]
