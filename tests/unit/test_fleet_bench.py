"""`gpuroute bench live --scenario`: its arguments, the fleet and router config it builds
from a scenario, each request's model and class, and how requests are judged and counted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from gpuroute.bench.cli import merge_policies
from gpuroute.bench.live_fleet import (
    FleetBenchSpec,
    by_group,
    fleet_router_config,
    fleet_targets,
    load_fleet,
    slo_judge,
    toml_value,
)
from gpuroute.bench.live_fleet_cli import fleet_spec
from gpuroute.bench.loadgen import RequestResult
from gpuroute.bench.targets import BenchError
from gpuroute.router.config.router import load_router_config
from gpuroute.sim.fleet import assign_models
from gpuroute.testbed.processes import Child
from support.paths import REPO

from gpuroute.cli import build_parser

REAL_FLEET = str(REPO / "sim" / "scenarios" / "real-fleet.toml")


def live_args(*argv: str):
    return build_parser().parse_args(["bench", "live", *argv])


@pytest.fixture(scope="module")
def fleet():
    return load_fleet(FleetBenchSpec(REAL_FLEET, duration_s=10, time_scale=2))


def test_the_options_become_a_spec_and_policies_take_a_comma_list() -> None:
    args = live_args("--scenario", "real-fleet", "--policies", "least_outstanding_work,slo_aware",
                     "--baselines", "none", "--duration", "30", "--time-scale", "3")  # fmt: skip
    merge_policies(args)
    spec = fleet_spec(args)
    assert spec.policies == ["least_outstanding_work", "slo_aware"] and spec.baselines == []
    assert (spec.scenario, spec.duration_s, spec.time_scale) == ("real-fleet", 30.0, 3.0)
    assert fleet_spec(live_args("--scenario", "x")).baselines == ["haproxy", "nginx"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "H100:1"], r"not with --engines \(the scenario's \[\[gpus\]\]"),
        (["--trace", "t.csv", "--kill", "1@2"], "not with --trace .*, --kill"),
        (["--replicas", "2"], "not with --replicas"),
        (["--baselines", "haproxy-weighted"], "'haproxy-weighted' cannot run a scenario"),
        (["--baselines", "envoy"], "'envoy' cannot run a scenario; known: haproxy, nginx"),
        (["--duration", "0"], "--duration > 0"),
        (["--policy", "fastest"], "--policy: unknown policy 'fastest'"),
    ],
)
def test_options_that_do_not_apply_to_a_scenario_are_refused(argv, message) -> None:
    with pytest.raises(BenchError, match=message):
        fleet_spec(live_args("--scenario", "real-fleet", *argv))


def test_the_fleet_is_the_scenarios_engines_at_its_mix_capacity(fleet) -> None:
    fleet, workload, rate = fleet
    assert fleet.keys == [
        *["H200-tp4/llama-3.1-70b"] * 2, "A800-tp4/llama-3.1-70b",
        *["MI300X/qwen3-30b-a3b"] * 2, *["L40S"] * 4, *["A800"] * 2,
    ]  # fmt: skip
    assert fleet.specs_file == Path(REAL_FLEET).resolve()  # engines read its A800 from it
    # the 70B pool saturates first: 30 % of requests on its capacity
    pool = 2 * fleet.profiles["H200-tp4/llama-3.1-70b"].capacity_rps
    pool += fleet.profiles["A800-tp4/llama-3.1-70b"].capacity_rps
    assert fleet.capacity_rps == pytest.approx(pool / 0.3)
    assert rate == pytest.approx(0.85 * fleet.capacity_rps / 2)
    assert workload.arrivals[-1] - workload.arrivals[0] <= 10.0
    assert len(workload) == pytest.approx(10 * rate, rel=0.15)


def test_each_request_model_is_the_simulators_draw(fleet) -> None:
    fleet, workload, _ = fleet
    models = fleet.request_models(len(workload))
    names, index = assign_models(5000, fleet.scenario)  # a longer run starts the same
    assert models == [names[k] for k in index[: len(workload)]]
    assert set(models) == {"llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b"}
    assert fleet.request_classes(len(workload)) == [0] * len(workload)


def test_the_router_config_declares_the_gpu_models_and_each_engine(fleet, tmp_path) -> None:
    fleet, _, _ = fleet
    engines = [Child(f"e{i}", None, 20000 + i, Path("x")) for i in range(len(fleet.kinds))]
    path = tmp_path / "router.toml"
    path.write_text(fleet_router_config(fleet, engines, 8080, "slo_aware", 2.0))
    config = load_router_config(path)
    assert [t.name for t in config.gpu_types] == ["A800"]
    assert config.gpu_types[0].interconnect_gbs == 400
    (model,) = config.models
    assert (model.name, model.shape, model.fallback) == ("llama-3.1-70b", "llama-3.1-70b",
                                                         ["llama-3.1-8b"])  # fmt: skip
    backends = [(b.gpu, tuple(b.models), b.tensor_parallel) for b in config.backends]
    assert backends[2] == ("A800", ("llama-3.1-70b",), 4)
    assert backends[3] == ("MI300X", ("qwen3-30b-a3b",), 1)
    assert backends[-1] == ("A800", ("llama-3.1-8b",), 1)
    (slo,) = config.slo.classes  # the scenario's SLO, slowed down with the engines
    assert (slo.ttft_s, slo.tpot_s, config.slo.prior_scale) == (4.0, 0.2, 2.0)


def test_baselines_are_left_out_of_a_fleet_of_several_models(fleet) -> None:
    fleet, _, _ = fleet
    spec = FleetBenchSpec(REAL_FLEET, policies=["slo_aware"], baselines=["haproxy", "nginx"])
    targets, notes = fleet_targets(spec, fleet)
    assert targets == ["slo_aware"]
    assert notes == [
        "haproxy, nginx skipped: the scenario serves 3 models and a connection balancer "
        "cannot route by the body's `model` (each engine serves one)"
    ]


def test_toml_values() -> None:
    assert toml_value(["a", 'b"c']) == '["a", "b\\"c"]'
    assert toml_value({"H100": 4.0, "A800": 2}) == '{ "H100" = 4.0, "A800" = 2 }'
    assert (toml_value(True), toml_value(1e-05)) == ("true", "1e-05")


def test_requests_are_judged_on_their_class_and_fallbacks_counted(fleet) -> None:
    fleet, _, _ = fleet
    met = slo_judge(fleet, [0, 0, 0, 0], 2.0)  # standard: TTFT 2 s, TPOT 0.1 s at GPU speed

    def served(i, ttft, e2e, model, ok=True) -> RequestResult:
        return RequestResult(i, 0.0, ok=ok, ttft_s=ttft, e2e_s=e2e, output_tokens=11,
                             served_model=model)  # fmt: skip

    results = [
        served(0, 3.9, 5.8, "llama-3.1-70b"),  # TPOT 0.19 s live: 0.095 at GPU speed, met
        served(1, 4.1, 5.0, "llama-3.1-8b"),  # a fallback's answer, TTFT missed
        served(2, 1.0, 3.0, "llama-3.1-8b"),
        served(3, math.nan, 1.0, None, ok=False),
    ]
    asked = ["llama-3.1-70b", "llama-3.1-70b", "llama-3.1-8b", "x"]
    groups = by_group(results, asked, asked, met)
    assert groups["llama-3.1-70b"] == {
        "requests": 2, "completed": 2, "failed": 0, "slo_attainment": 0.5,
        "ttft_p50_s": 4.0, "served_by_fallback": 1,
    }  # fmt: skip
    assert groups["llama-3.1-8b"]["served_by_fallback"] == 0
    assert groups["x"]["failed"] == 1 and groups["x"]["slo_attainment"] == 0.0
    # by SLO class, a fallback is still one the request's own model did not serve
    (standard,) = by_group(results, ["standard"] * 4, asked, met).values()
    assert (standard["requests"], standard["served_by_fallback"]) == (4, 1)


def test_a_one_model_scenario_keeps_the_baselines_and_its_slo_classes(tmp_path) -> None:
    path = str(REPO / "bench" / "scenarios" / "synthetic-chat-classes.toml")
    spec = FleetBenchSpec(path, policies=["slo_aware"], duration_s=5)
    fleet, workload, _ = load_fleet(spec)
    assert fleet.specs_file is None  # nothing declared: the engines need no --specs
    assert fleet_targets(spec, fleet) == (["slo_aware", "haproxy", "nginx"], [])
    engines = [Child(f"e{i}", None, 20000 + i, Path("x")) for i in range(len(fleet.kinds))]
    (tmp_path / "r.toml").write_text(fleet_router_config(fleet, engines, 8080, "slo_aware", 3))
    config = load_router_config(tmp_path / "r.toml")
    assert config.slo.default_class == "interactive"  # the first: any class may be asked for
    assert [(c.name, c.ttft_s) for c in config.slo.classes] == [
        ("interactive", 3.0), ("standard", 6.0), ("batch", 60.0),
    ]  # fmt: skip
    assert set(fleet.request_classes(len(workload))) == {0, 1, 2}
