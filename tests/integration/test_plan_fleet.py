"""Plan → fleet file → simulator: the fleet `gpuroute plan --write-fleet` writes passes
`check-config`, and `gpuroute sim --fleet` reproduces plan's figures for it (the same
scenario and seed: the same runs); one engine less of its scarcest pool makes that pool
miss. Scenarios name their engines three ways: [[gpus]] (`gpu =` or the old `type =`), a
`fleet = "file"` key, or `--fleet` (traffic from the scenario or from flags)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w
from gpuroute.sim.scenario import load_scenario
from gpuroute.sim.simulator import FleetSimulator
from support.two_models import A800, GPUS, SLO_70B, traffic

from gpuroute.cli import main
from gpuroute.config import ConfigError

PLAN = ["--gpu", "H100", "--gpu", "H100:tp2", "--quiet"]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def sim_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "sim.json"
    assert main(["sim", *args, "--policy", "default", "--quiet", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    return row


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """The two-model scenario planned at its own rate (40 req/s), its fleet written."""
    tmp = tmp_path_factory.mktemp("plan")
    scenario = write(tmp / "two.toml", traffic() + GPUS + SLO_70B)
    fleet, out = tmp / "fleet.toml", tmp / "plan.json"
    args = ["plan", "--scenario", scenario, *PLAN, "--write-fleet", str(fleet)]
    assert main([*args, "--json", str(out)]) == 0
    return Path(scenario), fleet, json.loads(out.read_text())


def test_written_fleet_is_whole_hosts_and_passes_check_config(
    planned: tuple[Path, Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    _, fleet, plan = planned
    assert [p["backends"] for p in plan["pools"]] == [{"H100": 2}, {"H100-tp2": 2}]
    document = tomllib.loads(fleet.read_text())
    (region,) = document["regions"]
    assert "deploy" not in region  # no --aws-region: no deploy key
    small, large = region["gpu_pools"]
    # the 8B on one-GPU p5.4xlarge hosts as planned; the 70B's two TP2 engines round up to
    # a whole p5.48xlarge (8 GPUs: four engines)
    assert (small["gpu"], small["count"], small["instance_type"]) == ("H100", 2, "p5.4xlarge")
    assert small["models"] == ["llama-3.1-8b"] and "tensor_parallel" not in small
    # simulated with the built-in shapes' 8-bit weights, so served with them
    assert small["engine"]["quantization"] == large["engine"]["quantization"] == "fp8"
    assert (large["count"], large["tensor_parallel"], large["instance_type"]) == (
        8,
        2,
        "p5.48xlarge",
    )
    assert document["models"][1] == {
        "name": "llama-3.1-70b",
        "slo": {"ttft_s": 0.5, "tpot_s": 0.04},
    }
    written = plan["written_fleet"]
    assert [(p["planned"], p["engines"]) for p in written["pools"]] == [(2, 2), (2, 4)]
    assert written["cost_per_hour"] == 2 * 4.0 + 4 * 8.0 and written["meets"]
    capsys.readouterr()
    assert main(["check-config", str(fleet)]) == 0
    assert "ok (fleet file, 1 region, 2 pools, 10 GPUs in 6 engines" in capsys.readouterr().out


def test_sim_of_the_written_fleet_reproduces_plans_figures(
    planned: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    scenario, fleet, plan = planned
    written = plan["written_fleet"]
    row = sim_json(tmp_path, "--fleet", str(fleet), "--scenario", str(scenario))
    assert row["slo_attainment"] == pytest.approx(written["attainment"], abs=0.005)
    for model, attainment in written["pool_attainment"].items():
        assert row["by_model"][model]["attainment"] == pytest.approx(attainment, abs=0.01)
    # the 70B's own SLO is its requests' class, as in the plan
    assert row["by_slo_class"].keys() == {"standard", "llama-3.1-70b"}


def test_one_engine_less_of_the_scarcest_pool_misses(
    planned: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    scenario, fleet, _ = planned
    document = tomllib.loads(fleet.read_text())
    pools = document["regions"][0]["gpu_pools"]
    (scarce,) = [p for p in pools if p["models"] == ["llama-3.1-8b"]]
    assert scarce["count"] == 2  # the pool with fewest engines: two
    scarce["count"] = 1
    fewer = write(tmp_path / "fewer.toml", tomli_w.dumps(document))
    row = sim_json(tmp_path, "--fleet", fewer, "--scenario", str(scenario))
    assert row["by_model"]["llama-3.1-8b"]["attainment"] < 0.9
    assert row["by_model"]["llama-3.1-8b"]["refused"] > 0


def test_a_scenario_is_a_fleet_plus_traffic(
    planned: tuple[Path, Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fleet = "..."` in a scenario runs what `--fleet` runs; [[gpus]] beside it is refused;
    check-config reads such a scenario."""
    scenario, fleet, _ = planned
    own = write(tmp_path / "own.toml", traffic(fleet=f'fleet = "{fleet}"'))
    by_key = sim_json(tmp_path, "--scenario", own)
    by_flag = sim_json(tmp_path, "--fleet", str(fleet), "--scenario", str(scenario))
    assert by_key["slo_attainment"] == by_flag["slo_attainment"]
    assert by_key["by_model"] == by_flag["by_model"]
    capsys.readouterr()
    assert main(["check-config", own]) == 0
    out = capsys.readouterr().out
    assert "ok (simulator scenario" in out and "6 engines on 10 GPUs" in out
    both = write(tmp_path / "both.toml", traffic(fleet=f'fleet = "{fleet}"') + GPUS)
    with pytest.raises(ConfigError, match=r"both.toml: gpus: the engines come from the fleet"):
        load_scenario(both)


def test_fleet_alone_takes_traffic_from_flags(
    planned: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    """Without a scenario each model's share of requests is its share of the GPUs (the 8B
    2 of 10, the 70B 8)."""
    _, fleet, _ = planned
    args = ["--fleet", str(fleet), "--rate-rps", "10", "--requests", "1000", "--seed", "3"]
    row = sim_json(tmp_path, *args)
    assert row["requests"] == 1000
    assert row["by_model"]["llama-3.1-8b"]["request_share"] == pytest.approx(0.2, abs=0.04)
    assert row["by_model"]["llama-3.1-70b"]["request_share"] == pytest.approx(0.8, abs=0.04)
    out = tmp_path / "cap.json"
    cap = ["capacity", "--fleet", str(fleet), "--requests", "600", "--policy", "default"]
    assert main([*cap, "--quiet", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    assert 0 < result["slo_capacity_rps"] < result["nominal_capacity_rps"] * 1.5


def test_write_fleet_for_aws(
    planned: tuple[Path, Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--aws-region writes the region's deploy key and the Hugging Face token reference
    that gated weights need: what check-config asks of a fleet that deploys."""
    scenario, _, _ = planned
    fleet = tmp_path / "aws.toml"
    args = ["plan", "--scenario", str(scenario), *PLAN]
    assert main([*args, "--write-fleet", str(fleet), "--aws-region", "us-east-1"]) == 0
    document = tomllib.loads(fleet.read_text())
    assert document["regions"][0]["deploy"] == {"aws_region": "us-east-1"}
    assert document["engine"] == {"hf_token": "hf-token"}
    assert document["secrets"] == {"hf-token": {"secretsmanager": "gpuroute/hf-token"}}
    assert main(["check-config", str(fleet)]) == 0
    assert main([*args, "--aws-region", "us-east-1"]) == 2
    assert "--aws-region goes with --write-fleet" in capsys.readouterr().err


def test_write_fleet_with_a_declared_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A declared GPU type goes into the file with its figures; no AWS instance carries it,
    so its pools keep their planned engines, and check-config passes until the region
    deploys to AWS, then names the type."""
    text = traffic(6.0, fleet=A800)
    scenario = write(tmp_path / "a800.toml", text + GPUS)
    fleet, out = tmp_path / "a800-fleet.toml", tmp_path / "plan.json"
    args = ["plan", "--scenario", scenario, "--quiet", "--json", str(out)]
    # one A800 holds the 70B's weights, not with the KV cache of the longest request at
    # vLLM's default 0.9 of its memory: check-config would refuse that pool, so plan does
    # when told one GPU per engine; a bare A800 is planned at TP 2 for the 70B
    assert main([*args, "--gpu", "A800:tp1"]) == 2
    assert (
        "A800: model llama-3.1-70b on A800: weights and the KV cache of the longest request"
        in capsys.readouterr().err
    )
    assert main([*args, "--gpu", "A800", "--write-fleet", str(fleet)]) == 0
    document = tomllib.loads(fleet.read_text())
    assert document["gpu_types"] == [
        {"name": "A800", "memory_gb": 80, "memory_bandwidth_tbs": 2.039, "fp16_tflops": 312,
         "price_per_hour": 2.2}
    ]  # fmt: skip
    plan = json.loads(out.read_text())
    pools = document["regions"][0]["gpu_pools"]
    planned = [(label, n) for p in plan["pools"] for label, n in p["backends"].items()]
    assert [p["count"] // p.get("tensor_parallel", 1) for p in pools] == [n for _, n in planned]
    assert planned[-1][0] == "A800-tp2" and pools[-1]["models"] == ["llama-3.1-70b"]
    assert all("instance_type" not in p for p in pools)
    assert main(["check-config", str(fleet)]) == 0
    deploys = fleet.read_text().replace(
        'jurisdiction = "us"', 'jurisdiction = "us"\ndeploy = { aws_region = "us-east-1" }'
    )
    fleet.write_text(deploys)
    capsys.readouterr()
    assert main(["check-config", str(fleet)]) == 2
    assert "no AWS instance type carries GPU type 'A800'" in capsys.readouterr().err


def test_old_and_new_gpu_keys_read_alike(tmp_path: Path) -> None:
    old = load_scenario(write(tmp_path / "old.toml", traffic() + GPUS.replace("gpu =", "type =")))
    new = load_scenario(write(tmp_path / "new.toml", traffic() + GPUS.replace("type =", "gpu =")))
    assert old.scenario.gpus == new.scenario.gpus
    assert (
        FleetSimulator(old).run("default").slo_attainment
        == FleetSimulator(new).run("default").slo_attainment
    )
