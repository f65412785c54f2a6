"""The engine-argument tables gpuroute ships (fleet/engine_flags) against the real vLLM's own
parser, from the cached CPU build: the table is what scripts/engine-flags.py reads from that
vLLM today, and the checker and vLLM's parser take and refuse the same command lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpuroute.fleet.checks import load_deploy_fleet
from gpuroute.fleet.engine_args import engine_argv
from gpuroute.fleet.engine_flags import check_engine_args
from support.real_vllm_parser import parse_with_real_vllm, regenerate_vllm_table

pytestmark = pytest.mark.real_engine

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.32.0"
RENDERED_70B = [
    "--model", "meta-llama/Llama-3.1-70B-Instruct", "--served-model-name", "llama-3.1-70b",
    "llama-70b", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1",
    "--max-model-len", "32768", "--quantization", "fp8", "--gpu-memory-utilization", "0.9",
    "--enable-lora", "--lora-modules", "sql-lora=org/sql-lora", "chat-lora=org/chat-lora",
]  # fmt: skip
EXTRA = [
    ["--enable-prefix-caching"],
    ["--max-num-seqs", "128", "--kv-cache-dtype", "fp8", "--max_num_batched_tokens=8192"],
    ["-O3", "--seed", "-1", "--no-enable-prefix-caching"],
    ["--compilation-config.mode", "3", "--no-enable-log-requests"],
    ["--speculative-config", '{"method": "ngram"}', "--max_num_batched_tokens=8k"],
    ["--host", "0.0.0.0", "--port", "8001"],  # Terraform's, after the fleet's
]
# (argument, what vLLM's parser and check_engine_args both refuse in it)
BAD = [
    ["--enable-prefix-cachingg"],
    ["--max-num-seqs", "many"],
    ["--kv-cache-dtype", "fp9"],
    ["--gpu-memory-utilization", "most"],
    ["--max-num-seqs"],
    ["--enable-prefix-caching=yes"],
]


def test_the_shipped_vllm_table_is_what_the_real_vllm_says(tmp_path):
    """Regenerating the table from the cached vLLM changes nothing: a new vLLM build means a
    new table (scripts/engine-flags.py vllm), never a stale one."""
    fresh = json.loads(regenerate_vllm_table(tmp_path / "vllm.json"))
    assert fresh["version"] == VERSION
    shipped = json.loads((ROOT / "fleet" / "engine_flags" / f"vllm-{VERSION}.json").read_text())
    assert fresh == shipped


def test_real_vllm_and_the_checker_agree_on_command_lines():
    """The fleet's rendered arguments (TP 4, max-model-len, fp8, LoRA modules) with extra
    arguments are taken by both; each bad argument is refused by both."""
    good = [RENDERED_70B + extra for extra in EXTRA]
    bad = [["--model", "m", *argument] for argument in BAD]
    verdicts = parse_with_real_vllm(good + bad)
    assert verdicts[: len(good)] == [None] * len(good), verdicts
    for argv, verdict in zip(bad, verdicts[len(good) :], strict=True):
        # argparse's own refusal, not a harness that broke (any exception reads as a verdict)
        assert verdict is not None and verdict.startswith(("vllm: error:", "vllm serve: error:")), (
            argv,
            verdict,
        )
    for argv in good:
        # Terraform's --host/--port and the rest are rendered, not the pool's extra_args
        assert check_engine_args("vllm", VERSION, argv, rendered=len(argv)) == [], argv
    for argv in bad:
        problems = check_engine_args("vllm", VERSION, argv, rendered=2)
        assert len(problems) == 1 and problems[0].startswith("engine.extra_args[0]: "), problems


def test_every_vllm_command_of_the_example_fleet_parses_with_the_real_vllm():
    """What `gpuroute tfvars` renders for each vLLM pool of fleet.example.toml, with the host
    and port Terraform adds, is taken by vLLM's own parser (and by the check)."""
    fleet = load_deploy_fleet(ROOT / "fleet.example.toml")
    argvs = {
        ref.key: [*engine_argv(fleet, ref.pool), "--host", "0.0.0.0", "--port", "8000"]
        for ref in fleet.pools()
        if fleet.engine_of(ref.pool).kind == "vllm"
    }
    assert len(argvs) >= 3
    verdicts = dict(zip(argvs, parse_with_real_vllm(list(argvs.values())), strict=True))
    assert verdicts == dict.fromkeys(argvs), verdicts
    for argv in argvs.values():
        assert check_engine_args("vllm", VERSION, argv, rendered=len(argv)) == []
