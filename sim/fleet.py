"""Fleet construction for the simulator: engines, backends, cost priors and capacity.

Capacity (requests/s a GPU sustains for a workload) is what `target_utilization` scales the
arrival rate against. It is measured, not derived: one engine of each type is run saturated
on a sample of the workload, because chunked prefill hides part of the prompt work under the
memory-bound decode and no closed formula captures how much. A request's "work" on a GPU (for
utilisation and the router's cost priors) is its prefill time plus its tokens at the saturated
per-token decode cost, scaled so that a saturated GPU does exactly one second of work per
second."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gpuroute.router.core.cost import GpuCostPrior
from gpuroute.sim.engine_model import EngineModel, EngineRequest
from gpuroute.sim.scenario import Scenario
from gpuroute.sim.workloads import Workload

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams


@dataclass(frozen=True, slots=True)
class GpuTypeProfile:
    params: EngineParams
    capacity_rps: float  # requests/s at saturation for this workload
    token_cost_s: float  # GPU-seconds per output token at saturation
    work_scale: float  # multiplies prefill + decode seconds into capacity-seconds
    saturation_batch: int
    prior: GpuCostPrior


def profile_gpu_types(scenario: Scenario, workload: Workload) -> dict[str, GpuTypeProfile]:
    model = MODELS[scenario.workload.model]
    return {
        gpu_type: profile_gpu_type(
            EngineParams(GPU_SPECS[gpu_type], model, chunked_prefill=scenario.chunked_prefill),
            workload,
        )
        for gpu_type in dict.fromkeys(g.type for g in scenario.gpus)
    }


def profile_gpu_type(params: EngineParams, workload: Workload) -> GpuTypeProfile:
    prompts = workload.prompts.astype(np.float64)
    mean_prompt = float(prompts.mean())
    mean_output = float(workload.outputs.mean())
    mean_prefill = float(np.mean(params.prefill_s(prompts)))
    token_cost = params.decode_token_cost_s(mean_prompt, mean_output)
    capacity = saturated_throughput(params, workload)
    scale = 1.0 / (capacity * (mean_prefill + mean_output * token_cost))
    prior = GpuCostPrior(scale * mean_prefill / mean_prompt, scale * token_cost)
    batch = params.saturation_batch(mean_prompt + mean_output)
    return GpuTypeProfile(params, capacity, token_cost, scale, batch, prior)


def request_work(profile: GpuTypeProfile, prompt_tokens: float, output_tokens: float) -> float:
    """Capacity-seconds one request costs a GPU of this type (no prefix-cache hit): what
    `gpu_util` adds up, in the simulator and for the live benchmark's engines."""
    return profile.work_scale * (
        float(profile.params.prefill_s(prompt_tokens)) + output_tokens * profile.token_cost_s
    )


def saturated_throughput(params: EngineParams, workload: Workload, sample: int = 2000) -> float:
    """Requests/s of one engine kept busy by the workload's first `sample` requests.

    All are queued at once (FCFS, as vLLM); the rate is taken between the 10th and 90th
    percentile completions, past the start-up fill and before the final drain."""
    engine = EngineModel(params, prefix_caching=False)
    count = 0
    for i in range(min(sample, len(workload))):
        req = EngineRequest(i, int(workload.prompts[i]), int(workload.outputs[i]), 0.0)
        count += engine.submit(req, 0.0)
    if count < 10:
        raise ValueError(f"workload requests do not fit on {params.gpu.name}")
    times = []
    while (t := engine.next_event_time()) is not None:
        times.extend(r.finished_at for r in engine.on_event(t))
    lo, hi = int(count * 0.1), int(count * 0.9)
    return (hi - lo) / (times[hi] - times[lo])


def expand_gpus(scenario: Scenario) -> list[str]:
    """GPU type of each instance, in [[gpus]] order (fault indices refer to this list)."""
    return [g.type for g in scenario.gpus for _ in range(g.count)]


def fleet_capacity_rps(scenario: Scenario, profiles: dict[str, GpuTypeProfile]) -> float:
    return sum(profiles[t].capacity_rps for t in expand_gpus(scenario))
