"""Load-balancing policies, one module each, all behind `Policy` (see base.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuroute.router.core.policies.base import PickContext, Policy
from gpuroute.router.core.policies.least_connections import LeastConnections
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.policies.p2c import PowerOfTwoChoices
from gpuroute.router.core.policies.prefix_affinity import PrefixAffinity
from gpuroute.router.core.policies.random_pick import RandomPick
from gpuroute.router.core.policies.round_robin import RoundRobin
from gpuroute.router.core.policies.session_affinity import SessionAffinity
from gpuroute.router.core.policies.weighted_round_robin import WeightedRoundRobin


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """Settings some policies take; each factory below reads the ones it uses."""

    full_scan_max: int = 64  # pools up to this size are scanned in full
    choices: int = 4  # candidates sampled from larger pools
    pick_among: int = 1  # >1 spreads replicas deciding on one shared view


POLICIES: dict[str, Callable[[PolicyOptions], Policy]] = {
    RoundRobin.name: lambda _o: RoundRobin(),
    RandomPick.name: lambda _o: RandomPick(),
    LeastConnections.name: lambda _o: LeastConnections(),
    WeightedRoundRobin.name: lambda _o: WeightedRoundRobin(),
    PowerOfTwoChoices.name: lambda _o: PowerOfTwoChoices(),
    LeastOutstandingWork.name: lambda o: LeastOutstandingWork(
        full_scan_max=o.full_scan_max, choices=o.choices, pick_among=o.pick_among
    ),
    PrefixAffinity.name: lambda o: PrefixAffinity(full_scan_max=o.full_scan_max, choices=o.choices),
    SessionAffinity.name: lambda _o: SessionAffinity(),
}
DEFAULT_POLICY = LeastOutstandingWork.name


def build_policy(name: str, options: PolicyOptions | None = None) -> Policy:
    """A fresh policy instance by name; unknown names list the known ones."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(options or PolicyOptions())


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "PickContext",
    "Policy",
    "PolicyOptions",
    "build_policy",
]
