"""`gpuroute plan`: the planned fleet meets the SLO at the peak in the simulator and one
backend less of its scarcest type misses; what no fleet can serve is refused with the
reason, before any search. The simulator is deterministic (the scenario's seed), so the
fleets and attainments are exact."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from gpuroute.planner.check import PlanError, parse_gpu_options, usable_options
from gpuroute.planner.plan import PlanLimits, plan_fleet
from gpuroute.sim.scenario import load_scenario
from gpuroute.sim.simulator import FleetSimulator
from support.two_models import A800, GPUS, SLO_70B, traffic

from gpuroute.cli import main
from gpuroute.config import ConfigError

SCENARIO = """
name = "plan-test"
seed = 3
{gpu_types}
[workload]
profile = "chat"
rate_rps = 20.0
max_requests = 1500
model = "{model}"

[[gpus]]
type = "{gpu}"
count = 1
tensor_parallel = {tp}

[slo]
{slo}
"""


def scenario(
    tmp_path: Path,
    *,
    slo: str = "ttft_s = 2.0\ntpot_s = 0.1",
    model: str = "llama-3.1-8b",
    tp: int = 1,
    gpu_types: str = "",
    gpu: str = "H100",
):
    path = tmp_path / "plan.toml"
    text = SCENARIO.format(slo=slo, model=model, tp=tp, gpu_types=gpu_types, gpu=gpu)
    path.write_text(text)
    return load_scenario(path)


def test_planned_fleet_meets_at_peak_and_one_less_misses(tmp_path: Path) -> None:
    loaded = scenario(tmp_path)
    options = parse_gpu_options(["H100", "A100", "L4"], loaded.scenario)
    plan = plan_fleet(loaded, options, PlanLimits(attainment=0.9), peak_rps=70.0)
    (pool,) = plan.pools
    # H100 carries ~28 req/s per backend at $4/h, A100 ~8 at $2.5/h, L4 ~1.7 at $0.7/h:
    # three H100s are the cheapest mix whose capacity covers 70 req/s, and two miss
    assert pool.backends == {"H100": 3}
    assert plan.cost_per_hour == 12.0
    assert plan.meets and plan.attainment >= 0.9
    assert plan.scarcest == "H100"
    assert plan.attainment_without_one_scarcest is not None
    assert plan.attainment_without_one_scarcest < 0.9
    assert pool.without_one == {"H100": plan.attainment_without_one_scarcest}
    # every mix tried that is cheaper than the plan missed the target
    assert all(a < 0.9 for _, cost, a in pool.tried if cost < plan.cost_per_hour)
    assert pool.runs <= PlanLimits().max_runs
    # $/hour over the tokens the peak brings in an hour, prompt and output
    assert 0 < plan.cost_per_million_tokens < plan.cost_per_million_output_tokens


def test_plan_is_deterministic_and_within_budget(tmp_path: Path) -> None:
    loaded = scenario(tmp_path)
    options = parse_gpu_options(["H100", "L4"], loaded.scenario)
    first = plan_fleet(loaded, options, PlanLimits(), peak_rps=20.0, budget_per_hour=4.0)
    again = plan_fleet(loaded, options, PlanLimits(), peak_rps=20.0, budget_per_hour=3.0)
    assert first.pools[0].backends == again.pools[0].backends == {"H100": 1}
    assert first.attainment == again.attainment
    assert first.within_budget and first.budget_fleet is None
    assert not again.within_budget
    # $3/hour buys four L4s (~1.7 req/s each at the SLO): far short of 20 req/s
    assert again.budget_fleet is not None
    assert again.budget_fleet.backends == {"llama-3.1-8b": {"L4": 4}}
    assert again.budget_fleet.cost_per_hour == 2.8
    assert again.budget_fleet.attainment < 0.9


def test_ttft_below_one_prefill_is_refused_naming_class_and_gpu(
    tmp_path: Path, monkeypatch
) -> None:
    slo = (
        '[[slo.classes]]\nname = "instant"\nttft_s = 0.001\ntpot_s = 0.1\nshare = 0.5\n'
        '[[slo.classes]]\nname = "batch"\nttft_s = 30.0\ntpot_s = 1.0\nshare = 0.5'
    )
    loaded = scenario(tmp_path, slo=slo)
    options = parse_gpu_options(["H100", "L4"], loaded.scenario)

    def no_search(*_args, **_kwargs):
        raise AssertionError("the simulator ran: it is answered from the roofline")

    monkeypatch.setattr(FleetSimulator, "run", no_search)
    with pytest.raises(PlanError) as caught:
        plan_fleet(loaded, options, PlanLimits(), peak_rps=50.0)
    message = str(caught.value)
    assert "model 'llama-3.1-8b'" in message
    assert "H100: SLO class 'instant': TTFT bound 0.001 s is below one" in message
    assert "L4: SLO class 'instant'" in message
    assert "'batch'" not in message


def test_class_within_the_target_share_does_not_block(tmp_path: Path) -> None:
    """A class out of reach everywhere but 5 % of traffic leaves 0.9 attainment possible."""
    slo = (
        '[[slo.classes]]\nname = "instant"\nttft_s = 0.001\ntpot_s = 0.1\nshare = 0.05\n'
        '[[slo.classes]]\nname = "chat"\nttft_s = 2.0\ntpot_s = 0.1\nshare = 0.95'
    )
    loaded = scenario(tmp_path, slo=slo)
    options = parse_gpu_options(["H100"], loaded.scenario)
    plan = plan_fleet(loaded, options, PlanLimits(attainment=0.9), peak_rps=20.0)
    assert plan.pools[0].backends == {"H100": 1}
    assert 0.9 <= plan.attainment <= 0.95 + 1e-9


def test_search_is_bounded_by_fleet_size(tmp_path: Path) -> None:
    loaded = scenario(tmp_path)
    options = parse_gpu_options(["L4"], loaded.scenario)
    with pytest.raises(PlanError, match=r"no mix of L4 up to 5 backends met the SLO at 20.0"):
        plan_fleet(loaded, options, PlanLimits(max_backends=5), peak_rps=20.0)


def test_model_that_fits_no_gpu_is_refused(tmp_path: Path) -> None:
    loaded = scenario(tmp_path, model="llama-3.1-405b", gpu="H200", tp=8)
    options = parse_gpu_options(["L4", "H100:tp1"], loaded.scenario)  # tp1: as said, not widened
    with pytest.raises(PlanError) as caught:
        plan_fleet(loaded, options, PlanLimits(), peak_rps=5.0)
    message = str(caught.value)
    assert "model 'llama-3.1-405b'" in message
    assert "L4: model llama-3.1-405b does not fit on L4" in message
    assert "H100: model llama-3.1-405b does not fit on H100" in message


def test_tpot_below_one_decode_step_is_refused(tmp_path: Path) -> None:
    loaded = scenario(tmp_path, model="llama-3.1-70b", tp=4, slo="ttft_s = 5.0\ntpot_s = 0.002")
    options = parse_gpu_options(["H100:tp4"], loaded.scenario)
    with pytest.raises(PlanError, match=r"H100-tp4: SLO class 'standard': TPOT bound 0.002 s"):
        plan_fleet(loaded, options, PlanLimits(), peak_rps=5.0)


def test_gpu_options_are_checked(tmp_path: Path) -> None:
    unpriced = (
        '[[gpu_types]]\nname = "X1"\nmemory_gb = 80\nmemory_bandwidth_tbs = 2\nfp16_tflops = 500\n'
    )
    loaded = scenario(tmp_path, gpu_types=unpriced)
    assert parse_gpu_options(["H100:tp2"], loaded.scenario)[0].price_per_hour == 8.0
    for spec, error in (
        ("Z9", "--gpu Z9:"),
        ("H100:4", "write TYPE or TYPE:tpN"),
        ("X1", "--gpu X1: no price; set price_per_hour"),
    ):
        with pytest.raises(ConfigError, match=error):
            parse_gpu_options([spec], loaded.scenario)


def test_cli_writes_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path).source
    out = tmp_path / "plan.json"
    args = ["plan", "--scenario", path, "--gpu", "H100", "--peak-rps", "20"]
    assert main([*args, "--json", str(out), "--budget", "5"]) == 0
    plan = json.loads(out.read_text())
    assert plan["pools"][0]["backends"] == {"H100": 1}
    assert plan["cost_per_hour"] == 4.0 and plan["meets"] is True
    assert "1×H100" in capsys.readouterr().out
    assert main([*args, "--quiet", "--budget", "3"]) == 3  # over budget
    if importlib.util.find_spec("matplotlib") is not None:  # optional: only --plot needs it
        png = tmp_path / "plan.png"
        assert main([*args, "--quiet", "--plot", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plan", "--scenario", path, "--gpu", "H100:x"]) == 2
    assert "--gpu H100:x: write TYPE or TYPE:tpN" in capsys.readouterr().err
    # no --gpu: the scenario's own types (its one H100)
    assert main(["plan", "--scenario", path, "--quiet", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["pools"][0]["capacity_per_backend_rps"].keys() == {"H100"}


def test_two_model_pools_are_planned_each_and_run_together(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text(
        'name = "two"\nseed = 5\n[workload]\nprofile = "chat"\nrate_rps = 10.0\n'
        'max_requests = 1000\nmodel = "llama-3.1-8b"\n'
        'models = { "llama-3.1-8b" = 0.7, "llama-3.1-70b" = 0.3 }\n'
        '[[gpus]]\ntype = "H100"\ncount = 1\n'
        '[[gpus]]\ntype = "H100"\ncount = 1\nmodel = "llama-3.1-70b"\ntensor_parallel = 2\n'
    )
    loaded = load_scenario(path)
    options = parse_gpu_options(["L4", "H100:tp2"], loaded.scenario)
    plan = plan_fleet(loaded, options, PlanLimits(), peak_rps=30.0)
    small, large = plan.pools
    assert (small.model, small.peak_rps) == ("llama-3.1-8b", 21.0)
    assert (large.model, large.peak_rps) == ("llama-3.1-70b", 9.0)
    # an H100 pair carries ~47 req/s of the 8B at the SLO, an L4 ~1.7: the 8B pool's
    # 21 req/s would take 13 L4s ($9.1/h), one pair ($8/h) is cheaper
    assert small.backends == {"H100-tp2": 1}
    assert large.backends == {"H100-tp2": 2}
    # one L4 cannot hold the 70B: planned at TP 4, where the pair of H100s is still cheaper
    assert large.notes == [
        "L4 cannot start llama-3.1-70b on one GPU: planned as L4-tp4 (say L4:tpN to choose)"
    ]
    assert set(large.capacity_per_backend_rps) == {"L4-tp4", "H100-tp2"}
    assert plan.cost_per_hour == small.cost_per_hour + large.cost_per_hour
    assert plan.meets and set(plan.by_model) == {"llama-3.1-8b", "llama-3.1-70b"}
    assert plan.attainment_without_one_scarcest is not None
    assert plan.attainment_without_one_scarcest < 0.9
    assert plan.scarcest == "H100-tp2"


def test_plan_takes_the_scenarios_declared_gpu_types(tmp_path: Path) -> None:
    """A type declared under [[gpu_types]] is planned with (it ended in a pydantic
    traceback: the planned [[gpus]] were checked against the built-ins alone)."""
    loaded = scenario(tmp_path, gpu_types=A800, gpu="A800")
    options = parse_gpu_options(["A800"], loaded.scenario)
    plan = plan_fleet(loaded, options, PlanLimits(), peak_rps=5.0)
    assert plan.pools[0].backends.keys() == {"A800"}
    assert plan.meets and plan.cost_per_hour == 2.2 * plan.pools[0].backends["A800"]


def test_a_bare_type_takes_the_least_tp_a_model_starts_on(tmp_path: Path) -> None:
    """`--gpu A800` for a 70B: one 80 GB GPU cannot start it (72.9 GB of weights and KV cache
    against 72 GB usable), so the plan runs it at TP 2 and says so; a given TP is kept."""
    loaded = scenario(tmp_path, gpu_types=A800, gpu="A800", model="llama-3.1-70b", tp=2)
    workload = FleetSimulator(loaded).workload
    bare = parse_gpu_options(["A800"], loaded.scenario)
    options, notes = usable_options(loaded.scenario, bare, "llama-3.1-70b", workload, 0.9)
    assert [(o.label, o.price_per_hour) for o in options] == [("A800-tp2", 4.4)]
    assert notes == [
        "A800 cannot start llama-3.1-70b on one GPU: planned as A800-tp2 (say A800:tpN to choose)"
    ]
    given = parse_gpu_options(["A800:tp1"], loaded.scenario)
    with pytest.raises(PlanError, match="could not start; give the type more GPUs per engine"):
        usable_options(loaded.scenario, given, "llama-3.1-70b", workload, 0.9)


def test_cli_plans_with_a_declared_type_and_names_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(tmp_path, gpu_types=A800).source
    args = ["plan", "--scenario", path, "--peak-rps", "5", "--quiet"]
    assert main([*args, "--gpu", "A800", "--json", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["pools"][0]["backends"] == {"A800": 1}
    assert main([*args, "--gpu", "A900"]) == 2
    err = capsys.readouterr().err
    assert "--gpu A900: unknown GPU type 'A900'" in err and "A800" in err


TWO_MODELS = traffic(10.0) + GPUS


def test_one_less_names_the_pool_that_misses_though_the_fleet_meets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 70B pool is a tenth of the traffic: with its one engine gone the whole fleet
    still meets 0.9 (the line said so, fleet-wide), while that pool serves nothing."""
    path = tmp_path / "two.toml"
    path.write_text(TWO_MODELS)
    options = parse_gpu_options(["H100", "H100:tp2"], load_scenario(path).scenario)
    plan = plan_fleet(load_scenario(path), options, PlanLimits(), peak_rps=40.0)
    assert [p.backends for p in plan.pools] == [{"H100": 2}, {"H100-tp2": 1}]
    assert plan.meets and plan.misses == []
    assert plan.pool_attainment.keys() == {"llama-3.1-8b", "llama-3.1-70b"}
    assert all(a >= 0.9 for a in plan.pool_attainment.values())
    assert (plan.scarcest, plan.scarcest_pool) == ("H100-tp2", "llama-3.1-70b")
    assert plan.attainment_without_one_scarcest is not None
    assert plan.attainment_without_one_scarcest >= 0.9  # fleet-wide it would "meet"
    assert plan.without_one_scarcest_by_pool["llama-3.1-70b"] < 0.9
    assert plan.misses_without_one_scarcest == ["llama-3.1-70b"]
    assert [(r["model"], r["slo_class"]) for r in plan.by_model_and_class] == [
        ("llama-3.1-8b", "standard"),
        ("llama-3.1-70b", "standard"),
    ]
    assert main(["plan", "--scenario", str(path), "--gpu", "H100", "--gpu", "H100:tp2",
                 "--peak-rps", "40"]) == 0  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())
    assert "per pool: llama-3.1-8b 1.000, llama-3.1-70b" in out
    assert "(every pool meets the 90% target)" in out
    assert (
        "with one H100-tp2 less in the llama-3.1-70b pool: that pool alone 0.000 (MISSES the "
        "90% target)" in out
    )


def test_a_models_own_slo_is_its_requests_and_its_pools(tmp_path: Path) -> None:
    """`slo = { ttft_s, tpot_s }` on the 70B: its requests are judged by it (a class named
    after the model), the 8B's by [slo]; the tighter SLO takes a second engine."""
    path = tmp_path / "slo.toml"
    path.write_text(TWO_MODELS + SLO_70B)
    loaded = load_scenario(path)
    report = FleetSimulator(loaded).run("default")
    assert report.by_slo_class.keys() == {"standard", "llama-3.1-70b"}
    assert report.by_slo_class["llama-3.1-70b"]["request_share"] == pytest.approx(
        report.by_model["llama-3.1-70b"]["request_share"]
    )
    options = parse_gpu_options(["H100", "H100:tp2"], loaded.scenario)
    plan = plan_fleet(loaded, options, PlanLimits(), peak_rps=40.0)
    small, large = plan.pools
    assert small.backends == {"H100": 2}
    assert large.backends == {"H100-tp2": 2}  # one carries the 70B at 2 s / 0.1 s (above)
    # (a lone H100 is left out for the 70B: it could not start with the longest request)
    assert large.notes[0].startswith("H100 left out for llama-3.1-70b: model llama-3.1-70b")
    rows = {(r["model"], r["slo_class"]): r for r in plan.by_model_and_class}
    assert rows.keys() == {("llama-3.1-8b", "standard"), ("llama-3.1-70b", "llama-3.1-70b")}
    own = rows["llama-3.1-70b", "llama-3.1-70b"]
    assert (own["ttft_s"], own["tpot_s"]) == (0.5, 0.04)
    assert plan.meets and plan.scarcest_pool == "llama-3.1-70b"
    assert plan.misses_without_one_scarcest == ["llama-3.1-70b"]
    # out of reach: the roofline says so for the model's own class, naming it
    path.write_text(TWO_MODELS + SLO_70B.replace("tpot_s = 0.04", "tpot_s = 0.002"))
    loaded = load_scenario(path)
    with pytest.raises(PlanError, match=r"H100-tp2: SLO class 'llama-3.1-70b': TPOT bound 0.002"):
        plan_fleet(loaded, parse_gpu_options(["H100:tp2"], loaded.scenario), PlanLimits(), 4.0)


def test_a_models_slo_class_may_not_shadow_an_slo_class(tmp_path: Path) -> None:
    path = tmp_path / "clash.toml"
    clash = '[[models]]\nname = "standard"\nshape = "llama-3.1-8b"\n'
    path.write_text(TWO_MODELS + clash + "slo = { ttft_s = 1, tpot_s = 1 }\n")
    with pytest.raises(ConfigError, match=r"models\[0\]\.slo: its class is named after the model"):
        load_scenario(path)
