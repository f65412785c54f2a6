"""The simulator end to end: determinism, faults, scenario errors and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpuroute.sim.scenario import builtin_scenario, load_scenario
from gpuroute.sim.simulator import FleetSimulator
from support.paths import REPO, shared_file

from gpuroute.cli import main
from gpuroute.config import ConfigError

REQUIRED_KEYS = {
    "policy",
    "requests",
    "completed",
    "rejected",
    "failed",
    "streams_continued",
    "streams_lost",
    "reprefill_share",
    "reprefill_work_share",
    "ttft_p50_s",
    "ttft_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "throughput_rps",
    "output_tokens_per_s",
    "goodput_rps",
    "gpu_util_mean",
    "gpu_util_cv",
    "prefix_hit_rate",
    "sim_wall_s",
}

SMALL = """
name = "small"
seed = {seed}
[workload]
profile = "{profile}"
target_utilization = 0.8
max_requests = {n}
[[gpus]]
type = "H100"
count = 2
[[gpus]]
type = "L4"
count = 2
[router]
policies = ["round_robin", "least_outstanding_work"]
"""


def scenario_file(
    tmp_path: Path, extra: str = "", seed: int = 1, profile: str = "chat", n: int = 2000
) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(SMALL.format(seed=seed, profile=profile, n=n) + extra)
    return path


def run_json(args: list[str], tmp_path: Path) -> list[dict]:
    out = tmp_path / "out.json"
    assert main(["sim", "--quiet", "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def strip_wall(results: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in results]


def test_same_seed_gives_identical_json(tmp_path) -> None:
    path = scenario_file(tmp_path, profile="shared-prefix", n=1500)
    first = run_json(["--scenario", str(path)], tmp_path)
    second = run_json(["--scenario", str(path)], tmp_path)
    assert strip_wall(first) == strip_wall(second)  # sim_wall_s is the one wall-clock field
    assert [r["policy"] for r in first] == ["round_robin", "least_outstanding_work"]
    assert set(first[0]) >= REQUIRED_KEYS
    other = run_json(["--scenario", str(scenario_file(tmp_path, seed=2, n=1500))], tmp_path)
    assert strip_wall(other) != strip_wall(first)


def test_every_request_is_accounted_for(tmp_path) -> None:
    (result,) = run_json(
        ["--scenario", str(scenario_file(tmp_path)), "--policy", "least_outstanding_work"], tmp_path
    )
    assert result["completed"] + result["rejected"] + result["failed"] == result["requests"] == 2000
    assert result["completed"] == 2000
    assert 0 < result["ttft_p50_s"] <= result["ttft_p99_s"] <= result["e2e_p99_s"]
    assert 0 < result["gpu_util_mean"] <= 1.0 and result["kv_peak_max"] <= 1.0


def test_crash_fault_retries_unstarted_requests_and_breaker_takes_over(tmp_path) -> None:
    extra = '[[faults]]\nat_s = 10\nkind = "crash"\ngpu = 0\n'
    (result,) = run_json(
        [
            "--scenario",
            str(scenario_file(tmp_path, extra, n=3000)),
            "--policy",
            "least_outstanding_work",
        ],
        tmp_path,
    )
    assert result["retries"] > 0
    # the streams under way on the crashed GPU went on elsewhere (tests/unit/
    # test_sim_continuation.py counts them exactly)
    assert result["streams_continued"] > 0 and result["streams_lost"] == 0
    assert result["completed"] + result["failed"] + result["rejected"] == 3000
    assert result["failed"] < 300  # the breaker stops sending to the dead GPU


def test_policies_differ_in_the_expected_direction_on_a_mixed_fleet() -> None:
    simulator = FleetSimulator(builtin_scenario())
    rr = simulator.run("round_robin")
    low = simulator.run("least_outstanding_work")
    assert low.e2e_p99_s < rr.e2e_p99_s / 3
    assert low.gpu_util_cv < rr.gpu_util_cv


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            SMALL.replace('profile = "{profile}"', 'profile = "poetry"'),
            "workload.profile: unknown profile 'poetry'",
        ),
        (SMALL.replace('type = "L4"', 'type = "B300"'), "gpus[1].type: unknown GPU"),
        (
            SMALL.replace("target_utilization = 0.8", "target_utilization = 4"),
            "workload.target_utilization: must be <= 3",
        ),
        (SMALL.replace("target_utilization = 0.8", ""), "set exactly one of `target_utilization`"),
        (
            SMALL.replace(
                'policies = ["round_robin", "least_outstanding_work"]', 'policies = ["fast"]'
            ),
            "router.policies: unknown policy 'fast'",
        ),
        (SMALL + "\nbogus = 1\n", "bogus: unknown key"),
        (  # a model its GPUs cannot hold: said at load, naming the group, not a traceback
            SMALL.replace("max_requests = {n}", 'max_requests = {n}\nmodel = "llama-3.1-70b"'),
            "gpus[1]: model llama-3.1-70b does not fit on L4 (24 GB)",
        ),
    ],
)
def test_bad_scenarios_get_a_one_line_error_naming_the_key(
    tmp_path, capsys, body, fragment
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body.format(seed=1, profile="chat", n=10))
    assert main(["sim", "--quiet", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and fragment in err and str(path) in err


def test_missing_trace_and_unknown_policy_flag(tmp_path, capsys) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        '[workload]\ntrace = "nope.csv"\nformat = "azure"\nrate_scale = 1\n'
        '[[gpus]]\ntype = "A100"\ncount = 1\n'
    )
    assert main(["sim", "--quiet", "--scenario", str(path)]) == 2
    assert "trace file not found" in capsys.readouterr().err
    assert main(["sim", "--quiet", "--policy", "fastest"]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err


def test_builtin_demo_prints_a_table(capsys) -> None:
    assert main(["sim", "--policy", "least_outstanding_work"]) == 0
    out = capsys.readouterr().out
    assert "least_outstanding_work" in out and "TTFT p99" in out


def test_shipped_scenarios_validate() -> None:
    for path in sorted((REPO / "sim" / "scenarios").glob("*.toml")):
        loaded = load_scenario(path)
        assert loaded.scenario.gpu_count >= 1, path


@pytest.mark.shared_data
def test_azure_trace_scenario_replays_the_whole_trace(tmp_path) -> None:
    shared_file("azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    loaded = load_scenario(REPO / "sim" / "scenarios" / "azure-conv-hetero.toml")
    simulator = FleetSimulator(loaded)
    assert len(simulator.workload) == 19_366
    capacity = sum(simulator.profiles[t].capacity_rps for t in simulator.gpu_types)
    assert simulator.rate_rps == pytest.approx(0.85 * capacity)


def test_scenario_by_name_or_path(tmp_path, monkeypatch) -> None:
    """A packaged scenario's name works from any folder, even one holding a folder of that
    name (the repository's demo/); anything path-like is read as a file."""
    from gpuroute.sim.run import resolve_scenario

    monkeypatch.chdir(REPO)
    assert (REPO / "demo").is_dir()
    by_name = resolve_scenario("demo")
    assert by_name.scenario == builtin_scenario().scenario
    by_path = resolve_scenario("sim/scenarios/demo.toml")
    assert by_path.scenario == by_name.scenario
    with pytest.raises(ConfigError, match=r"no built-in scenario named 'nope'; known: .*demo"):
        resolve_scenario("nope")
    with pytest.raises(ConfigError, match="file not found"):
        resolve_scenario(str(tmp_path / "missing.toml"))


def test_the_simulated_router_learns_only_what_a_live_router_can_see(tmp_path: Path) -> None:
    """The simulator's scheduler is the live router's: fed step times a live router never
    sees (engine step ÷ batch, prefill ÷ prompt), its cost rates drifted with load and moved
    work between GPU types that the live router, on the same fleet and trace, did not."""
    loaded = load_scenario(scenario_file(tmp_path, n=600))
    simulator = FleetSimulator(loaded)
    _, run = simulator.replay("default")
    estimator = run.scheduler.estimator
    for gpu_type, profile in simulator.profiles.items():
        assert estimator.rates(gpu_type) == profile.prior
