"""`gpuroute bench real`'s workloads and argument checks (the runs need a real vLLM)."""

from __future__ import annotations

import random

import pytest
from gpuroute.bench.real_engine import requests_for, run_real_bench
from gpuroute.bench.targets import BenchError


def test_prefix_workload_interleaves_conversations_that_share_long_system_prompts() -> None:
    reqs = requests_for("prefix", random.Random(3), scale=1, salt="0001|")
    systems = [text.split(" ", 1)[0] for text, _ in reqs]
    assert len(reqs) == 56 and len(set(systems)) == 7  # odd: round robin cannot align
    assert all(len(s) == 6149 and s.startswith("0001|") for s in systems)
    # turn by turn: the seven conversations in the same order every turn
    assert systems[:7] == systems[7:14] == systems[49:]
    assert all(8 <= n <= 48 for _, n in reqs)
    # another target: the same lengths, in text no cache has seen
    other = requests_for("prefix", random.Random(3), scale=1, salt="0002|")
    assert [len(t) for t, _ in other] == [len(t) for t, _ in reqs]
    assert not {t for t, _ in other} & {t for t, _ in reqs}


def test_chat_workload_has_no_reuse_and_bounded_lengths() -> None:
    reqs = requests_for("chat", random.Random(3), scale=2)
    assert len(reqs) == 72 and len({text for text, _ in reqs}) == 72
    assert all(1 <= len(text) <= 6000 and 1 <= n <= 400 for text, n in reqs)
    assert requests_for("chat", random.Random(3), 2) == reqs  # seeded: the same every run


def test_unknown_targets_and_workloads_are_refused_by_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPUROUTE_VLLM_PYTHON", "/bin/sh")  # past the vLLM check
    with pytest.raises(BenchError, match="targets: default, round_robin, smg-cache-aware"):
        run_real_bench(["haproxy"], ["prefix"], tmp_path)
    with pytest.raises(BenchError, match="workloads: prefix, chat"):
        run_real_bench(["default"], ["code"], tmp_path)
