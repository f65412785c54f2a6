"""A pool's engine arguments checked without the engine installed (gpuroute.fleet.engine_flags,
against the tables scripts/engine-flags.py reads from vLLM's and SGLang's own parsers), and
`check-config` refusing a bad one, naming the pool and the argument. That the vLLM table is
the real parser's: tests/real_engine/test_engine_flags_real.py."""

from __future__ import annotations

import pytest
import tomli_w
from gpuroute.fleet.engine_flags import check_engine_args, nearest_version, table_versions
from gpuroute.fleet.schema import DEFAULT_VERSIONS

from gpuroute.cli import main

VLLM = "0.32.0"
SGLANG = "0.5.23"
POOL = {"gpu": "L40S", "count": 2, "models": ["qwen3-8b"]}


def vllm(*extra: str, version: str = VLLM) -> list[str]:
    rendered = ["--model", "Qwen/Qwen3-8B", "--served-model-name", "qwen3-8b"]
    return check_engine_args("vllm", version, [*rendered, *extra], rendered=len(rendered))


def test_the_tables_are_shipped() -> None:
    """Each engine's default version (gpuroute.fleet.schema) has its own table."""
    assert VLLM in table_versions("vllm") and DEFAULT_VERSIONS["vllm"] in table_versions("vllm")
    assert SGLANG in table_versions("sglang")
    assert DEFAULT_VERSIONS["sglang"] in table_versions("sglang")


def test_arguments_vllm_takes_pass() -> None:
    """(tests/real_engine/test_engine_flags_real.py: the real vLLM takes them too.)"""
    assert vllm("--enable-prefix-caching", "--max-num-seqs", "64", "--kv-cache-dtype", "fp8") == []
    assert vllm("--max_num_batched_tokens=8k", "-O3", "--seed", "-1") == []
    assert vllm("--compilation-config.mode", "3", "--no-enable-log-requests") == []
    assert vllm("--speculative-config", '{"method": "ngram"}') == []


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--enable-prefix-cache"], "unknown option --enable-prefix-cache of vLLM 0.32.0 "
         "(`vllm serve`); did you mean --enable-prefix-caching"),
        (["--max-num-seqs"], "--max-num-seqs needs a value"),
        (["--max-num-seqs", "--enforce-eager"], "--max-num-seqs needs a value"),
        (["--max-num-seqs", "lots"], "--max-num-seqs 'lots': not an integer"),
        (["--swap-space", "4"], "unknown option --swap-space"),
        (["--gpu-memory-utilisation", "0.5"], "did you mean --gpu-memory-utilization"),
        (["--kv-cache-dtype", "fp9"], "--kv-cache-dtype 'fp9': not one of vLLM 0.32.0's "
         "choices; did you mean fp8"),
        (["--enforce-eager=yes"], "--enforce-eager takes no value"),
        (["--max-num-se", "4"], "write --max-num-seqs in full"),
        (["stray"], "'stray' would be read as a value of --served-model-name"),
    ],
)  # fmt: skip
def test_a_bad_vllm_argument_is_refused_naming_it(extra, said) -> None:
    (problem,) = vllm(*extra)
    assert problem.startswith("engine.extra_args[0]: ")
    assert said in problem


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["--tensor-parallel-size", "2"], "tensor_parallel"),
        (["-tp", "2"], "tensor_parallel"),
        (["--max_model_len", "4096"], "engine.max_model_len"),
        (["--quantization", "fp8"], "engine.quantization"),
        (["--served-model-name", "other"], "models"),
        (["--lora-modules", "a=b"], "engine.lora_modules"),
    ],
)
def test_an_option_gpuroute_sets_is_refused_in_extra_args_naming_the_key(extra, key) -> None:
    (problem,) = vllm("--enable-prefix-caching", *extra)
    assert problem.startswith("engine.extra_args[1]: ")
    assert f"is set by gpuroute from the pool's `{key}`; set that instead" in problem


def test_host_and_port_are_the_hosts() -> None:
    (problem,) = vllm("--port", "9000")
    assert "--port is set per engine on the host" in problem


def test_a_bad_value_of_a_fleet_key_names_the_key() -> None:
    argv = ["--model", "m", "--quantization", "fp9"]
    (problem,) = check_engine_args("vllm", VLLM, argv, rendered=len(argv))
    assert problem.startswith("engine.quantization: --quantization 'fp9': not one of vLLM")


@pytest.mark.parametrize("version", [SGLANG, "0.5.6"])
def test_sglang_arguments(version) -> None:
    rendered = ["--model-path", "m", "--served-model-name", "a", "--tp-size", "2",
                "--pp-size", "1", "--context-length", "32768", "--enable-metrics"]  # fmt: skip
    good = [*rendered, "--max-running-requests", "64", "--schedule-policy", "lpm"]
    assert check_engine_args("sglang", version, good, rendered=len(rendered)) == []
    bad = [*rendered, "--max_running_requests", "64", "--enable-metrics", "--tp", "4"]
    first, second, third = check_engine_args("sglang", version, bad, rendered=len(rendered))
    assert f"unknown option --max_running_requests of SGLang {version}" in first  # no _ for -
    assert "did you mean --max-running-requests" in first
    assert second.startswith("engine.extra_args[2]: --enable-metrics is set by gpuroute")
    assert third.startswith("engine.extra_args[3]: --tp is set by gpuroute from the pool's")


def test_a_version_without_a_table_is_checked_against_the_nearest_and_says_so() -> None:
    assert nearest_version("0.32.3", ["0.30.1", "0.32.0", "0.33.0"]) == "0.32.0"
    assert nearest_version("0.31.0", ["0.30.1", "0.32.0"]) == "0.30.1"
    assert nearest_version("0.1.0", ["0.30.1", "0.32.0"]) == "0.30.1"
    assert nearest_version("", ["0.30.1", "0.32.0"]) == "0.32.0"
    assert vllm("--enable-prefix-caching", version="0.32.5") == []
    (problem,) = vllm("--bogus-flag", version="0.32.5")
    assert problem.endswith("(checked against vLLM 0.32.0's options: no table for version 0.32.5)")


def test_check_config_refuses_a_bad_engine_argument_naming_the_pool(tmp_path, capsys) -> None:
    pool = POOL | {"name": "qwen-l40s", "engine": {"extra_args": ["--max-num-seqs", "lots"]}}
    data = {
        "regions": [
            {"name": "us-east", "jurisdiction": "us", "location": {"lat": 38.9, "lon": -77.0},
             "deploy": {"aws_region": "us-east-1"}, "gpu_pools": [pool]},
        ],
    }  # fmt: skip
    path = tmp_path / "fleet.toml"
    path.write_text(tomli_w.dumps(data))
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: regions[0].gpu_pools[0]" in err, err
    assert "engine.extra_args[0]: --max-num-seqs 'lots': not an integer" in err, err
