"""The fleet file read whole (gpuroute.fleet): the example deploys on paper, each engine's
command line comes from its pool, and a fleet that cannot run is refused by `check-config`
and `tfvars` as `file: key: message`, with the numbers that decide it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
from gpuroute.fleet.checks import load_deploy_fleet
from gpuroute.fleet.engine_args import engine_argv
from gpuroute.fleet.instances import instance_for, load_catalog
from gpuroute.fleet.schema import read_deploy_fleet
from gpuroute.fleet.tfvars import render_tfvars
from support.paths import REPO

from gpuroute.cli import main
from gpuroute.config import ConfigError

EXAMPLE = REPO / "fleet.example.toml"


def fleet_file(tmp_path: Path, pools: list[dict], **top) -> Path:
    """A one-region fleet file in AWS with these pools (and top-level tables)."""
    data = {
        "deploy": {"global_regions": ["us-east", "eu-west"]},
        "secrets": {"hf-token": {"secretsmanager": "gpuroute/hf-token"}},
        "engine": {"hf_token": "hf-token"},
        "regions": [
            {"name": "us-east", "jurisdiction": "us", "location": {"lat": 38.9, "lon": -77.0},
             "deploy": {"aws_region": "us-east-1"}, "gpu_pools": pools},
            {"name": "eu-west", "jurisdiction": "eu", "location": {"lat": 50.1, "lon": 8.7},
             "deploy": {"aws_region": "eu-central-1"}},
        ],
    } | top  # fmt: skip
    path = tmp_path / "fleet.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def refused(path: Path, capsys) -> list[str]:
    """check-config and tfvars both refuse the file with the same lines; those lines."""
    assert main(["check-config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    with pytest.raises(ConfigError) as tfvars:
        render_tfvars(path)
    said = str(tfvars.value).splitlines()
    # check-config ends with how it told the file's kind
    assert lines[:-1] == [f"gpuroute check-config: error: {said[0]}", *said[1:]]
    assert lines[-1].startswith("(checked as a fleet file")
    return said


def test_the_example_fleet_passes_check_config_and_renders(capsys) -> None:
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert "3 regions, 6 pools, 52 GPUs in 34 engines, 3 models" in capsys.readouterr().out
    pools = {
        (region, p["name"]): p
        for region, r in json.loads(render_tfvars(EXAMPLE))["regions"].items()
        for p in r["gpu_pools"]
    }
    h200 = pools["us-east", "llama70b-h200"]
    assert (h200["instance_type"], h200["gpus_per_host"], h200["tensor_parallel"]) == (
        "p5e.48xlarge", 8, 4,
    )  # fmt: skip
    assert h200["engine"]["args"][:8] == [
        "--model", "meta-llama/Llama-3.1-70B-Instruct", "--served-model-name", "llama-3.1-70b",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1",
    ]  # fmt: skip
    assert pools["ap-northeast", "llama8b-a10g"]["instance_type"] == "g5.xlarge"
    assert pools["us-east", "llama8b-l40s"]["instance_type"] == "g6e.xlarge"
    moe = pools["eu-west", "qwen-moe-rtx"]  # the declared GPU type, on its own instance type
    assert (moe["gpu"], moe["instance_type"], moe["engine"]["kind"]) == (
        "RTX-PRO-6000", "g7e.2xlarge", "sglang",
    )  # fmt: skip
    assert moe["engine"]["image"] == "lmsysorg/sglang:v0.5.6"
    assert all(p["engine"]["hf_token"]["name"] == "gpuroute/hf-token" for p in pools.values())


def test_the_catalog_has_every_current_aws_gpu_family() -> None:
    families = {i.name.split(".")[0] for i in load_catalog()}
    assert {"p5", "p5e", "p5en", "p6-b200", "p4d", "p4de", "g6e", "g6", "g5", "g4dn"} <= families
    by_name = {i.name: i for i in load_catalog()}
    assert (by_name["p5e.48xlarge"].gpu, by_name["p5e.48xlarge"].gpus) == ("H200", 8)
    assert by_name["p4d.24xlarge"].gpu_memory_gb == 40  # the A100 40 GB, not the type's 80


@pytest.mark.parametrize(
    ("gpu", "tp", "instance"),
    [("L40S", 1, "g6e.xlarge"), ("L40S", 4, "g6e.12xlarge"), ("L40S", 8, "g6e.48xlarge"),
     ("H200", 4, "p5e.48xlarge"), ("A10G", 2, "g5.12xlarge"), ("T4", 8, "g4dn.metal")],
)  # fmt: skip
def test_a_pool_without_an_instance_type_gets_the_first_that_holds_whole_engines(
    tmp_path, gpu, tp, instance
) -> None:
    path = fleet_file(
        tmp_path,
        [{"gpu": gpu, "count": 8 * tp, "models": ["qwen3-8b"], "tensor_parallel": tp}],
    )
    fleet = read_deploy_fleet(path)
    assert instance_for(fleet, fleet.regions[0].gpu_pools[0]).name == instance


def test_a_model_that_does_not_fit_names_the_memory_short(tmp_path, capsys) -> None:
    path = fleet_file(tmp_path, [{"gpu": "L40S", "count": 2, "models": ["llama-3.1-70b"]}])
    (line,) = refused(path, capsys)
    assert line.startswith(
        f"{path}: regions[0].gpu_pools[0]: llama-3.1-70b does not fit L40S: it needs "
    )
    # 70.6 GB of 8-bit weights and 131072 tokens of KV cache, against 48 GB x 0.9
    assert "and L40S hold 43.2 GB (48 GB each x gpu_memory_utilization 0.9)" in line
    assert "GB short; use a larger tensor_parallel" in line


def test_the_memory_is_the_instances(tmp_path, capsys) -> None:
    """A100s on p4d have 40 GB: a 70B at TP2 fits an 80 GB A100 pair, not a 40 GB one."""
    pool = {"gpu": "A100", "count": 8, "models": ["llama-3.1-70b"], "tensor_parallel": 2,
            "engine": {"max_model_len": 8192}}  # fmt: skip
    fits = fleet_file(tmp_path, [pool | {"instance_type": "p4de.24xlarge"}])
    load_deploy_fleet(fits)
    (line,) = refused(fleet_file(tmp_path, [pool | {"instance_type": "p4d.24xlarge"}]), capsys)
    assert "does not fit 2 x A100" in line and "(40 GB each" in line


def test_a_gpu_type_no_instance_offers_is_refused_naming_where_it_can_go(tmp_path, capsys) -> None:
    path = fleet_file(tmp_path, [{"gpu": "MI300X", "count": 8, "models": ["qwen3-30b-a3b"]}])
    (line,) = refused(path, capsys)
    assert line.startswith(
        f"{path}: regions[0].gpu_pools[0]: no AWS instance type carries GPU type 'MI300X'"
    )
    assert "aws_instance_types" in line and "gpuroute agent" in line


def test_a_tensor_parallel_that_divides_no_host_is_refused(tmp_path, capsys) -> None:
    path = fleet_file(
        tmp_path,
        [{"gpu": "H200", "count": 12, "models": ["llama-3.1-70b"], "tensor_parallel": 3}],
    )
    (line,) = refused(path, capsys)
    assert line == (
        f"{path}: regions[0].gpu_pools[0]: tensor_parallel x pipeline_parallel = 3 GPUs per "
        "engine divides no H200 instance's GPUs (8 per host); use a tensor_parallel that "
        "divides one"
    )
    named = fleet_file(
        tmp_path,
        [{"gpu": "L40S", "count": 8, "models": ["qwen3-8b"], "tensor_parallel": 2,
          "instance_type": "g6e.xlarge"}],
    )  # fmt: skip
    (line,) = refused(named, capsys)
    assert line.endswith("2 GPUs per engine does not divide g6e.xlarge's 1 GPUs")


def test_two_pools_autoscaling_one_model_in_a_region_are_refused(tmp_path, capsys) -> None:
    scaled = {"gpu": "L40S", "count": 4, "models": ["qwen3-8b"], "min_hosts": 2, "max_hosts": 8}
    path = fleet_file(tmp_path, [scaled, scaled | {"gpu": "A10G"}])
    (line,) = refused(path, capsys)
    assert line.startswith(
        f"{path}: regions[0].gpu_pools[0]: a pool that scales is the only pool of its region "
        "serving its model, but regions[0].gpu_pools[1] also serves 'qwen3-8b'"
    )


def test_a_secret_not_in_the_files_references_is_refused(tmp_path, capsys) -> None:
    path = fleet_file(
        tmp_path,
        [{"gpu": "L40S", "count": 1, "models": ["qwen3-8b"],
          "engine": {"hf_token": "hf-tokn"}}],
    )  # fmt: skip
    (line,) = refused(path, capsys)
    assert line.startswith(
        f"{path}: regions[0].gpu_pools[0]: engine.hf_token: secret 'hf-tokn' is not in the "
        "file's [secrets] (declared: hf-token)"
    )


def test_a_gated_model_without_a_token_is_refused(tmp_path, capsys) -> None:
    path = fleet_file(
        tmp_path, [{"gpu": "L40S", "count": 1, "models": ["llama-3.1-8b"],
                    "engine": {"max_model_len": 8192}}], engine={},
    )  # fmt: skip
    (line,) = refused(path, capsys)
    assert "engine.hf_token: meta-llama/Llama-3.1-8B-Instruct is a gated" in line


def test_every_problem_is_said_at_once(tmp_path, capsys) -> None:
    path = fleet_file(
        tmp_path,
        [{"gpu": "MI300X", "count": 1, "models": ["qwen3-8b"]},
         {"gpu": "L40S", "count": 1, "models": ["llama-3.1-405b"], "engine": {"hf_token": "x"}}],
    )  # fmt: skip
    lines = refused(path, capsys)
    assert [line.split(": ")[1] for line in lines] == ["regions[0].gpu_pools[0]"] + [
        "regions[0].gpu_pools[1]"
    ] * 2


def test_engine_command_lines_follow_the_pool(tmp_path) -> None:
    path = fleet_file(
        tmp_path,
        [{"gpu": "H200", "count": 8, "models": ["llama-3.1-70b", "llama-70b"],
          "tensor_parallel": 4, "pipeline_parallel": 2,
          "engine": {"max_model_len": 8192, "quantization": "fp8",
                     "gpu_memory_utilization": 0.85, "lora_modules": {"sql": "org/sql-lora"},
                     "extra_args": ["--enable-prefix-caching"]}},
         {"gpu": "H200", "count": 8, "models": ["qwen3-30b-a3b"], "tensor_parallel": 2,
          "engine": {"kind": "sglang", "max_model_len": 4096}}],
    )  # fmt: skip
    fleet = load_deploy_fleet(path)
    vllm, sglang = fleet.regions[0].gpu_pools
    assert engine_argv(fleet, vllm) == [
        "--model", "meta-llama/Llama-3.1-70B-Instruct",
        "--served-model-name", "llama-3.1-70b", "llama-70b",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--max-model-len", "8192", "--quantization", "fp8", "--gpu-memory-utilization", "0.85",
        "--enable-lora", "--lora-modules", "sql=org/sql-lora", "--enable-prefix-caching",
    ]  # fmt: skip
    assert engine_argv(fleet, sglang) == [
        "--model-path", "Qwen/Qwen3-30B-A3B", "--served-model-name", "qwen3-30b-a3b",
        "--tp-size", "2", "--pp-size", "1", "--context-length", "4096", "--enable-metrics",
    ]  # fmt: skip
    assert fleet.image_of(vllm) == "vllm/vllm-openai:v0.32.0"


def test_a_pools_engine_settings_go_over_the_fleets_key_by_key(tmp_path) -> None:
    path = fleet_file(
        tmp_path,
        [{"gpu": "L40S", "count": 1, "models": ["qwen3-8b"],
          "engine": {"image": "registry.example/vllm:patched"}}],
        engine={"hf_token": "hf-token", "version": "0.31.0", "max_model_len": 4096},
    )  # fmt: skip
    fleet = load_deploy_fleet(path)
    pool = fleet.regions[0].gpu_pools[0]
    assert fleet.image_of(pool) == "registry.example/vllm:patched"  # its image, not the version
    assert fleet.engine_of(pool).max_model_len == 4096
    assert fleet.engine_of(pool).hf_token == "hf-token"


def test_a_pool_of_partial_engines_is_refused(tmp_path) -> None:
    path = fleet_file(
        tmp_path, [{"gpu": "H200", "count": 6, "models": ["qwen3-8b"], "tensor_parallel": 4}]
    )
    with pytest.raises(ConfigError, match=r"regions\[0\]\.gpu_pools\[0\]: count \(6 GPUs\) is "
                       r"not a whole number of engines"):  # fmt: skip
        load_deploy_fleet(path)


def test_check_config_reads_a_scenario(capsys) -> None:
    assert main(["check-config", str(REPO / "sim" / "scenarios" / "real-fleet.toml")]) == 0
    out = capsys.readouterr().out
    assert "simulator scenario, 'real-fleet': 11 engines on 20 GPUs, 3 models" in out


def test_the_global_tier_reads_the_fleet_file() -> None:
    from gpuroute.regions import load_fleet

    fleet = load_fleet(EXAMPLE)
    assert [r.name for r in fleet.regions] == ["us-east", "eu-west", "ap-northeast"]


def test_a_fleet_wide_secret_missing_is_said_once(tmp_path, capsys) -> None:
    pool = {"gpu": "L40S", "count": 1, "models": ["qwen3-8b"]}
    path = fleet_file(tmp_path, [pool, pool | {"name": "two"}], engine={"hf_token": "hf_tokn"})
    (line,) = refused(path, capsys)
    assert line.startswith(f"{path}: engine.hf_token: secret 'hf_tokn' is not in the file's")


def test_a_pool_of_another_engine_does_not_take_the_fleets_version(tmp_path) -> None:
    path = fleet_file(
        tmp_path,
        [{"gpu": "L40S", "count": 1, "models": ["qwen3-8b"], "engine": {"kind": "sglang"}}],
        engine={"hf_token": "hf-token", "version": "0.32.0"},
    )
    fleet = load_deploy_fleet(path)
    assert fleet.image_of(fleet.regions[0].gpu_pools[0]) == "lmsysorg/sglang:v0.5.6"


def test_an_engine_without_quantization_loads_the_16_bit_checkpoint(tmp_path, capsys) -> None:
    """The built-in shapes are simulated with 8-bit weights; an engine given no
    quantization loads the public BF16 checkpoint: 141 GB of a 70B on one H200's 127."""
    pool = {"gpu": "H200", "count": 8, "models": ["llama-3.1-70b"],
            "engine": {"max_model_len": 8192}}  # fmt: skip
    (line,) = refused(fleet_file(tmp_path, [pool]), capsys)
    assert "llama-3.1-70b does not fit H200: it needs 143.8 GB (weights 141.1 GB" in line
    fp8 = pool | {"engine": {"max_model_len": 8192, "quantization": "fp8"}}
    load_deploy_fleet(fleet_file(tmp_path, [fp8]))
