"""Fleet construction for the simulator: engines, backends, cost priors and capacity.

Capacity (requests/s a GPU sustains for a workload) is what `target_utilization` scales the
arrival rate against, and a request's "work" on a GPU (used for utilisation) is its prefill
time plus its tokens at the saturated per-token decode cost."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gpuroute.router.core.cost import GpuCostPrior
from gpuroute.sim.engine_model import EngineParams
from gpuroute.sim.models import MODELS
from gpuroute.sim.scenario import Scenario
from gpuroute.sim.workloads import Workload

from gpuroute.gpus import GPU_SPECS


@dataclass(frozen=True, slots=True)
class GpuTypeProfile:
    params: EngineParams
    capacity_rps: float  # requests/s at saturation for this workload
    token_cost_s: float  # GPU-seconds per output token at saturation
    saturation_batch: int
    prior: GpuCostPrior


def profile_gpu_types(scenario: Scenario, workload: Workload) -> dict[str, GpuTypeProfile]:
    model = MODELS[scenario.workload.model]
    prompts = workload.prompts.astype(np.float64)
    mean_prompt = float(prompts.mean())
    mean_output = float(workload.outputs.mean())
    profiles = {}
    for gpu_type in dict.fromkeys(g.type for g in scenario.gpus):
        params = EngineParams(GPU_SPECS[gpu_type], model)
        mean_prefill = float(np.mean(params.prefill_s(prompts)))
        token_cost = params.decode_token_cost_s(mean_prompt, mean_output)
        capacity = 1.0 / (mean_prefill + mean_output * token_cost)
        prior = GpuCostPrior(mean_prefill / mean_prompt, token_cost)
        batch = params.saturation_batch(mean_prompt + mean_output)
        profiles[gpu_type] = GpuTypeProfile(params, capacity, token_cost, batch, prior)
    return profiles


def expand_gpus(scenario: Scenario) -> list[str]:
    """GPU type of each instance, in [[gpus]] order (fault indices refer to this list)."""
    return [g.type for g in scenario.gpus for _ in range(g.count)]


def fleet_capacity_rps(scenario: Scenario, profiles: dict[str, GpuTypeProfile]) -> float:
    return sum(profiles[t].capacity_rps for t in expand_gpus(scenario))
