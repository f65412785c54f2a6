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
from gpuroute.router.core.policies.slo_aware import SloAware
from gpuroute.router.core.policies.weighted_round_robin import WeightedRoundRobin


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """Settings some policies take; each factory below reads the ones it uses."""

    full_scan_max: int = 64  # pools up to this size are scanned in full
    choices: int = 4  # candidates sampled from larger pools
    pick_among: int = 1  # >1 spreads replicas deciding on one shared view
    gpu_prices: dict[str, float] | None = None  # $/hour per GPU type (slo_aware's cost score)
    cost_weight: float = 0.1  # slo_aware: weight of cost against slack
    slo_margin: float = 0.9  # slo_aware: a backend fits when predicted <= margin x the SLO


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
    SloAware.name: lambda o: SloAware(
        prices=o.gpu_prices, cost_weight=o.cost_weight, margin=o.slo_margin
    ),
}
DEFAULT_POLICY = SloAware.name
DEFAULT_ALIAS = "default"  # `--policy default`: whatever DEFAULT_POLICY is


def resolve_policy_name(name: str) -> str:
    """The policy `name` stands for (`default`: DEFAULT_POLICY); ValueError listing the
    known names for an unknown one."""
    resolved = DEFAULT_POLICY if name == DEFAULT_ALIAS else name
    if resolved not in POLICIES:
        known = ", ".join((*POLICIES, DEFAULT_ALIAS))
        raise ValueError(f"unknown policy {name!r}; known: {known}")
    return resolved


def build_policy(name: str, options: PolicyOptions | None = None) -> Policy:
    """A fresh policy instance by name (or `default`); unknown names list the known ones."""
    return POLICIES[resolve_policy_name(name)](options or PolicyOptions())


__all__ = [
    "DEFAULT_ALIAS",
    "DEFAULT_POLICY",
    "POLICIES",
    "PickContext",
    "Policy",
    "PolicyOptions",
    "build_policy",
    "resolve_policy_name",
]
