"""Measured GPU capacity: ordered like the data sheets and raised by chunked prefill."""

from __future__ import annotations

import pytest
from gpuroute.sim.fleet import saturated_throughput
from gpuroute.sim.workloads import synthetic

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams

MODEL = MODELS["llama-3.1-8b"]


def capacity(gpu: str, chunked: bool = True) -> float:
    workload = synthetic("chat", 2000, 1.0, 3)
    return saturated_throughput(
        EngineParams(GPU_SPECS[gpu], MODEL, chunked_prefill=chunked), workload
    )


def test_capacity_follows_the_data_sheets() -> None:
    caps = [capacity(g) for g in ("H100", "A100", "V100", "L4", "T4")]
    assert caps == sorted(caps, reverse=True)


def test_chunked_prefill_raises_capacity_most_on_compute_rich_gpus() -> None:
    gain = {g: capacity(g) / capacity(g, chunked=False) for g in ("H100", "L4")}
    assert gain["H100"] > 1.1
    assert gain["H100"] > gain["L4"] >= 1.0


def test_a_workload_too_big_for_the_gpu_is_a_clear_error() -> None:
    workload = synthetic("chat", 50, 1.0, 3)
    workload.prompts[:] = 10_000_000
    with pytest.raises(ValueError, match="do not fit on T4"):
        saturated_throughput(EngineParams(GPU_SPECS["T4"], MODEL), workload)
