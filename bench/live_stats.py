"""What the live benchmarks measure of a run: latency percentiles, SLO attainment and
goodput (as the simulator defines them), which engine and GPU kind served each request, and
each engine's simulated GPU busy time and work utilisation."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import aiohttp
import numpy as np
from gpuroute.bench.loadgen import RequestResult
from gpuroute.sim.fleet import GpuTypeProfile, profile_gpu_type, request_work
from gpuroute.sim.report import offered_window_s
from gpuroute.sim.workloads import Workload
from gpuroute.testbed.processes import Child
from prometheus_client.parser import text_string_to_metric_families

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams
from gpuroute.stats import percentile


def q(values, p: float) -> float:
    """The `p`th percentile, as every live figure reports it (numpy's, interpolated)."""
    return round(percentile(values, p), 4)


MODEL = "llama-3.1-8b"


class JudgedRun(Protocol):
    """What `summarise` reads of a run's spec (bench.live's LiveBenchSpec has it): the
    engines' slowdown and the one SLO, at GPU speed."""

    time_scale: float
    slo_ttft_s: float
    slo_tpot_s: float


def summarise(
    target: str,
    results: list[RequestResult],
    spec: JudgedRun,
    workload: Workload,
    met_slo: Callable[[RequestResult], bool] | None = None,
) -> dict:
    """Latency percentiles, throughput over the run, and SLO attainment and goodput as the
    simulator defines them (per second of offered traffic; the SLO at GPU speed, so times
    the time scale here). `met_slo`: whether a completed request met its own SLO (else the
    spec's one SLO judges every request)."""
    ok = [r for r in results if r.ok]
    ttft = np.array([r.ttft_s for r in ok]) if ok else np.array([math.nan])
    e2e = np.array([r.e2e_s for r in ok]) if ok else np.array([math.nan])
    first = min((r.sent_at for r in results), default=0.0)
    last = max((r.sent_at + r.e2e_s for r in results if not math.isnan(r.e2e_s)), default=1.0)
    span = max(last - first, 1e-9)
    scale = spec.time_scale
    good = 0
    for r in ok:
        if met_slo is not None:
            good += met_slo(r)
            continue
        tpot = (r.e2e_s - r.ttft_s) / max(r.output_tokens - 1, 1)
        good += r.ttft_s <= spec.slo_ttft_s * scale and tpot <= spec.slo_tpot_s * scale

    return {
        "target": target,
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "ttft_p50_s": q(ttft, 50),
        "ttft_p99_s": q(ttft, 99),
        "e2e_p50_s": q(e2e, 50),
        "e2e_p99_s": q(e2e, 99),
        "throughput_rps": round(len(ok) / span, 3),
        "goodput_rps": round(good / offered_window_s(workload.arrivals), 3),
        "slo_attainment": round(good / max(len(results), 1), 4),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "_span_s": span,
        "_ttft": ttft.tolist(),  # samples for --plot; not written to JSON
        "_e2e": e2e.tolist(),
    }


async def engine_stats(engines: list[Child], elapsed_s: float) -> dict:
    """Requests each engine served and its simulated GPU busy share (nvidia-smi's util)."""

    served, busy = [], []
    async with aiohttp.ClientSession() as session:
        for child in engines:
            try:
                async with session.get(child.url + "/metrics") as response:
                    text = await response.text()
            except aiohttp.ClientError:
                served.append(None)  # killed during the run
                continue
            values: dict[str, float] = {}  # summed over label sets (finish reasons, ...)
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
            served.append(int(float(values.get("vllm:request_success_total", 0))))
            busy.append(float(values.get("gpuroute_fake_gpu_busy_seconds", 0)) / elapsed_s)
    busy_arr = np.asarray(busy)
    cv = float(busy_arr.std() / busy_arr.mean()) if busy_arr.size and busy_arr.mean() > 0 else 0.0
    return {
        "engine_requests": served,
        "gpu_busy_mean": round(float(busy_arr.mean()), 4) if busy_arr.size else 0.0,
        "gpu_busy_cv": round(cv, 4),
    }


def work_utilisation(
    results: list[RequestResult],
    workload: Workload,
    engines: list[tuple[str, Child]],
    span_s: float,
    time_scale: float,
    profiles: dict[str, GpuTypeProfile] | None = None,
) -> dict:
    """Each engine's `gpu_util` as the simulator defines it (work at saturated per-token cost
    over the run's duration, sim/fleet.py), from which engine served each request (the
    router's x-gpuroute-backend header; the baselines do not say, so they get nothing).
    `profiles`: by each engine's label (its engine kind's key); default: one GPU of each
    built-in type running the default model."""
    index = engine_index(engines)
    if not any(r.backend in index for r in results):
        return {}
    if profiles is None:
        model = MODELS[MODEL]
        profiles = {
            gpu: profile_gpu_type(EngineParams(GPU_SPECS[gpu], model), workload)
            for gpu in {gpu for gpu, _ in engines}
        }
    work = [0.0] * len(engines)
    for r in results:
        i = index.get(r.backend) if r.ok else None
        if i is not None:
            work[i] += request_work(
                profiles[engines[i][0]],
                float(workload.prompts[r.index]),
                float(workload.outputs[r.index]),
            )
    util = np.asarray(work) / (span_s / time_scale)  # engines run time_scale x slower
    return {
        "gpu_util_mean": round(float(util.mean()), 4),
        "gpu_util_cv": round(float(util.std() / util.mean()), 4) if util.mean() > 0 else 0.0,
    }


async def served_stats(
    results: list[RequestResult],
    workload: Workload,
    pairs: list[tuple[str, Child]],
    elapsed_s: float,
    span_s: float,
    time_scale: float,
    profiles: dict[str, GpuTypeProfile] | None = None,
) -> dict:
    """What both live runs report of where requests went: each GPU kind's share, each
    engine's served requests and busy time, and the work utilisation."""
    out = gpu_shares(results, pairs)
    out |= await engine_stats([child for _, child in pairs], elapsed_s)
    out |= work_utilisation(results, workload, pairs, span_s, time_scale, profiles)
    return out


def engine_index(engines: list[tuple[str, Child]]) -> dict[str, int]:
    """Each engine's index by the backend id our router names it by (x-gpuroute-backend)."""
    return {f"127.0.0.1:{child.port}": i for i, (_, child) in enumerate(engines)}


def gpu_shares(results: list[RequestResult], engines: list[tuple[str, Child]]) -> dict:
    """Each GPU type's share of the completed requests, from the engine that served each
    (our router's x-gpuroute-backend header; the baselines do not say, so they get none)."""
    index = engine_index(engines)
    served = [engines[index[r.backend]][0] for r in results if r.ok and r.backend in index]
    if not served:
        return {}
    return {
        "gpu_share": {gpu: round(served.count(gpu) / len(served), 4) for gpu in sorted(set(served))}
    }
