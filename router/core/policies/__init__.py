"""Load-balancing policies, one module each, all behind `Policy` (see base.py), and the one
builder every caller uses: a policy's name and its settings table → the policy.

Adding a policy is one module (its class, its `Settings` dataclass) and one line in
POLICIES; its settings are then read from `[policy_settings.<name>]` and checked by check-config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuroute.router.core.policies.base import (
    NoSettings,
    PickContext,
    Policy,
    PolicyFacts,
    SettingError,
    settings_from,
)
from gpuroute.router.core.policies.least_connections import LeastConnections
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.policies.p2c import PowerOfTwoChoices
from gpuroute.router.core.policies.prefix_affinity import PrefixAffinity
from gpuroute.router.core.policies.random_pick import RandomPick
from gpuroute.router.core.policies.round_robin import RoundRobin
from gpuroute.router.core.policies.session_affinity import SessionAffinity
from gpuroute.router.core.policies.slo_aware import SloAware
from gpuroute.router.core.policies.weighted_round_robin import WeightedRoundRobin

POLICIES: dict[str, type[Policy]] = {
    RoundRobin.name: RoundRobin,
    RandomPick.name: RandomPick,
    LeastConnections.name: LeastConnections,
    WeightedRoundRobin.name: WeightedRoundRobin,
    PowerOfTwoChoices.name: PowerOfTwoChoices,
    LeastOutstandingWork.name: LeastOutstandingWork,
    PrefixAffinity.name: PrefixAffinity,
    SessionAffinity.name: SessionAffinity,
    SloAware.name: SloAware,
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


def policy_settings(name: str, table: Mapping[str, object] | None = None) -> object:
    """The settings of policy `name` (or `default`) from its settings table (a config's
    `[policy_settings.<name>]`): SettingError naming `<name>.<key>` for an unknown key, a value of
    the wrong type or out of range."""
    resolved = resolve_policy_name(name)
    return settings_from(POLICIES[resolved].Settings, table or {}, resolved)


def check_policy_table(name: str, table: Mapping[str, object], where: str) -> None:
    """A config's `[<where>.<name>]` names a policy and holds settings it takes: ValueError
    naming the key (`policy_settings.slo_aware.cost_weight: expected a number, got 'x'`)."""
    if name not in POLICIES:
        raise ValueError(f"{where}.{name}: unknown policy; known: {', '.join(POLICIES)}")
    try:
        policy_settings(name, table)
    except SettingError as exc:
        raise ValueError(f"{where}.{exc}") from None


@dataclass(frozen=True, slots=True)
class OlderKey:
    """A policy setting a config also takes under a key older than its policy settings
    tables: that key as the config names it (`slo.cost_weight`), its value, and whether the
    file sets it there (a conflict with the table is an error only then)."""

    key: str
    value: object
    set_in_file: bool


def settings_table(
    name: str, table: Mapping[str, object], older: Mapping[str, OlderKey], where: str
) -> dict[str, object]:
    """The settings table policy `name` is built with: its `[<where>.<name>]` `table` over
    what the config's older keys say of it (setting → OlderKey), each config passing its
    own. ValueError naming both keys when the file sets a setting in both places
    (`policy_settings.slo_aware.margin: also set as slo.margin; set one`)."""
    for setting, old in older.items():
        if old.set_in_file and setting in table:
            raise ValueError(f"{where}.{name}.{setting}: also set as {old.key}; set one")
    return {setting: old.value for setting, old in older.items()} | dict(table)


def build_policy(
    name: str, table: Mapping[str, object] | None = None, facts: PolicyFacts | None = None
) -> Policy:
    """A fresh policy by name (or `default`) with its settings table and the fleet's facts;
    an unknown name lists the known ones, a bad setting is a SettingError naming it."""
    cls = POLICIES[resolve_policy_name(name)]
    return cls.from_settings(policy_settings(name, table), facts or PolicyFacts())


__all__ = [
    "DEFAULT_ALIAS",
    "DEFAULT_POLICY",
    "POLICIES",
    "NoSettings",
    "OlderKey",
    "PickContext",
    "Policy",
    "PolicyFacts",
    "SettingError",
    "build_policy",
    "check_policy_table",
    "policy_settings",
    "resolve_policy_name",
    "settings_table",
]
