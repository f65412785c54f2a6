"""The one policy builder: a policy's name and settings table → the policy, each setting
typed and checked (a bad one named), in the router's config and check-config, a reload's
config and a scenario alike; the older keys feed the same tables."""

from __future__ import annotations

import pytest
from gpuroute.router.config.router import load_router_config
from gpuroute.router.core.policies import (
    POLICIES,
    OlderKey,
    PolicyFacts,
    SettingError,
    build_policy,
    policy_settings,
    settings_table,
)
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.policies.prefix_index import PrefixIndex
from gpuroute.router.core.policies.slo_aware import SloAware
from gpuroute.router.core.policies.stages import CostShare, StallShare
from gpuroute.sim.scenario import load_scenario

from gpuroute.cli import main
from gpuroute.config import ConfigError

BACKEND = '[[backends]]\nurl = "http://127.0.0.1:9"\ngpu = "H100"\nmodels = ["m"]\n'
SCENARIO = '[workload]\nprofile = "chat"\nrate_rps = 1\nmax_requests = 10\n'
SCENARIO += '[[gpus]]\ntype = "L4"\ncount = 1\n'


def test_a_settings_table_reaches_the_plug_ins_it_configures() -> None:
    policy = build_policy(
        "slo_aware", {"cost_weight": 0.5, "stall_weight": 2, "margin": 0.8},
        PolicyFacts({"L4": 9.0}),
    )  # fmt: skip
    assert isinstance(policy, SloAware)
    cost = next(s for s in policy.scorers if isinstance(s, CostShare))
    stall = next(s for s in policy.scorers if isinstance(s, StallShare))
    assert (cost.weight, cost.prices["L4"], stall.weight) == (0.5, 9.0, 2.0)
    assert isinstance(stall.weight, float)  # a TOML integer for a float setting
    assert policy.fit.margins.of("H100|standard", 0.0) == 0.8
    low = build_policy("least_outstanding_work", {"pick_among": 3})
    assert isinstance(low, LeastOutstandingWork) and low.picker.among == 3
    assert build_policy("default").name == "slo_aware"


@pytest.mark.parametrize(
    ("name", "table", "message"),
    [
        (
            "slo_aware",
            {"cost_wieght": 1.0},
            "slo_aware.cost_wieght: unknown setting; known: margin",
        ),
        (
            "slo_aware",
            {"cost_weight": "high"},
            "slo_aware.cost_weight: expected a number, got 'high'",
        ),
        ("slo_aware", {"margin": 1.5}, "slo_aware.margin: must be in (0, 1]"),
        ("slo_aware", {"per_type": 4}, "slo_aware.sample_per_type: must be >= per_type"),
        ("slo_aware", {"adapter_headroom": 0}, "slo_aware.adapter_headroom: must be in (0, 1]"),
        # the plug-ins' configs check these, named by the policy's own keys
        ("slo_aware", {"cost_weight": -1}, "slo_aware.cost_weight: must be >= 0"),
        ("slo_aware", {"adapter_width": 0}, "slo_aware.adapter_width: must be >= 1"),
        (
            "slo_aware",
            {"adapter_shrink_after_s": 0},
            "slo_aware.adapter_shrink_after_s: must be > 0",
        ),
        (
            "least_outstanding_work",
            {"pick_among": 0},
            "least_outstanding_work.pick_among: must be >= 1",
        ),
        ("least_outstanding_work", {"choices": 1}, "least_outstanding_work.choices: must be >= 2"),
        (
            "least_outstanding_work",
            {"pick_among": True},
            "pick_among: expected an integer, got True",
        ),
        ("least_outstanding_work", {"choices": 2.5}, "choices: expected an integer, got 2.5"),
        ("prefix_affinity", {"guard_factor": 0.5}, "prefix_affinity.guard_factor: must be >= 1"),
        ("session_affinity", {"vnodes": 0}, "session_affinity.vnodes: must be >= 1"),
        ("round_robin", {"choices": 4}, "round_robin.choices: unknown setting; known: none"),
    ],
)
def test_a_bad_setting_is_named(name: str, table: dict, message: str) -> None:
    with pytest.raises(SettingError) as caught:
        build_policy(name, table)
    assert message in str(caught.value)


def test_every_policy_builds_from_an_empty_table_with_its_defaults() -> None:
    for name, cls in POLICIES.items():
        assert build_policy(name, {}).name == name
        assert policy_settings(name) == cls.Settings()


def test_the_prefix_index_is_declared_not_probed() -> None:
    """Policies that keep a prefix index say so in the interface; the others say None."""
    keeping = {n for n in POLICIES if isinstance(build_policy(n).prefix_index, PrefixIndex)}
    assert keeping == {"slo_aware", "prefix_affinity"}
    assert all(build_policy(n).prefix_index is None for n in POLICIES.keys() - keeping)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[policy_settings.slo_aware]\ncost_wieght = 0.2\n",
            "policy_settings.slo_aware.cost_wieght: unknown setting; known: margin, cost_weight",
        ),
        (
            '[policy_settings.least_outstanding_work]\nchoices = "4"\n',
            "policy_settings.least_outstanding_work.choices: expected an integer, got '4'",
        ),
        ("[policy_settings.fastest]\nx = 1\n", "policy_settings.fastest: unknown policy; known:"),
        (
            "[slo]\ncost_weight = 0.3\n[policy_settings.slo_aware]\ncost_weight = 0.2\n",
            "policy_settings.slo_aware.cost_weight: also set as slo.cost_weight; set one",
        ),
    ],
)
def test_check_config_names_the_file_and_the_setting(tmp_path, capsys, text, message) -> None:
    path = tmp_path / "router.toml"
    path.write_text(text + BACKEND)
    with pytest.raises(ConfigError, match="^" + str(path)):
        load_router_config(path)
    assert main(["check-config", str(path)]) == 2
    assert f"{path}: {message}" in capsys.readouterr().err


def test_the_router_and_the_simulator_fill_one_table_from_old_and_new_keys(tmp_path) -> None:
    router = tmp_path / "router.toml"
    router.write_text(
        '[slo]\nmargin = 0.7\n[redis]\nurl = "redis://127.0.0.1:9"\npick_among = 3\n'
        "[policy_settings.slo_aware]\ncost_weight = 0.4\n" + BACKEND
    )
    config = load_router_config(router)
    assert config.policy_table("slo_aware") == {"margin": 0.7, "cost_weight": 0.4}
    assert config.policy_table("least_outstanding_work") == {"pick_among": 3}
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        SCENARIO + "[router]\nfull_scan_max = 8\n"
        "[router.policy_settings.least_outstanding_work]\npick_among = 2\n"
    )
    section = load_scenario(scenario).scenario.router
    assert section.policy_table("least_outstanding_work") == {
        "full_scan_max": 8, "choices": 4, "pick_among": 2,
    }  # fmt: skip
    # slo_aware samples on its own full_scan_max: the scenario's older key is not its
    assert section.policy_table("default") == {"cost_weight": 0.1, "margin": 0.9}


def test_a_scenario_names_a_bad_setting(tmp_path) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO + "[router.policy_settings.p2c]\nchoices = 2\n")
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    assert f"{path}: router.policy_settings.p2c.choices: unknown setting" in str(caught.value)


def test_one_table_from_older_keys_and_a_setting_set_twice_is_named() -> None:
    older = {
        "margin": OlderKey("slo.margin", 0.9, False),  # a default: the table may set it
        "cost_weight": OlderKey("slo.cost_weight", 0.3, True),
    }
    table = settings_table("slo_aware", {"margin": 0.7}, older, "policy_settings")
    assert table == {"margin": 0.7, "cost_weight": 0.3}
    with pytest.raises(ValueError) as caught:
        settings_table("slo_aware", {"cost_weight": 0.2}, older, "policy_settings")
    message = "policy_settings.slo_aware.cost_weight: also set as slo.cost_weight; set one"
    assert str(caught.value) == message


def test_pick_among_set_twice_is_an_error_only_where_the_file_shares_the_load(tmp_path) -> None:
    both = "[redis]\npick_among = 3\n{}[policy_settings.least_outstanding_work]\npick_among = 2\n"
    shared = tmp_path / "shared.toml"
    shared.write_text(both.format('url = "redis://127.0.0.1:9"\n') + BACKEND)
    with pytest.raises(ConfigError, match=r"least_outstanding_work\.pick_among: also set as redis"):
        load_router_config(shared)
    alone = tmp_path / "alone.toml"
    alone.write_text(both.format("") + BACKEND)
    config = load_router_config(alone)  # the workers (maybe --workers) are not the file's
    assert config.policy_table("least_outstanding_work", workers=4) == {"pick_among": 2}
    assert config.policy_table("least_outstanding_work") == {"pick_among": 2}


def test_a_scenario_names_a_setting_set_twice(tmp_path) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text(
        SCENARIO + "[router]\nslo_margin = 0.8\n[router.policy_settings.slo_aware]\nmargin = 0.7\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    message = "router.policy_settings.slo_aware.margin: also set as router.slo_margin; set one"
    assert f"{path}: {message}" in str(caught.value)
