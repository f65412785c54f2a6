"""Fleet construction for the simulator: engines, backends, cost priors and capacity.

Capacity (requests/s a GPU sustains for a workload) is what `target_utilization` scales the
arrival rate against. It is measured, not derived: one engine of each type is run saturated
on a sample of the workload, because chunked prefill hides part of the prompt work under the
memory-bound decode and no closed formula captures how much. A request's "work" on a GPU (for
utilisation and the router's cost priors) is its prefill time plus its tokens at the saturated
per-token decode cost, scaled so that a saturated GPU does exactly one second of work per
second."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.cost import GpuCostPrior
from gpuroute.sim.engine_model import EngineModel, EngineRequest
from gpuroute.sim.scenario import Scenario
from gpuroute.sim.workloads import Workload

from gpuroute.roofline import EngineKind, EngineParams


@dataclass(frozen=True, slots=True)
class GpuTypeProfile:
    params: EngineParams
    capacity_rps: float  # requests/s at saturation for this workload
    token_cost_s: float  # GPU-seconds per output token at saturation
    work_scale: float  # multiplies prefill + decode seconds into capacity-seconds
    saturation_batch: int
    prior: GpuCostPrior


def profile_gpu_types(scenario: Scenario, workload: Workload) -> dict[str, GpuTypeProfile]:
    """Each engine kind's profile, by its key (the GPU type alone for one GPU running the
    workload's default model, so a single-model scenario reads as before)."""
    default = scenario.workload.model
    kinds = dict.fromkeys(g.kind(default) for g in scenario.gpus)
    return {
        kind.key(default): profile_gpu_type(scenario.engine_params(kind), workload)
        for kind in kinds
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


def expand_kinds(scenario: Scenario) -> list[EngineKind]:
    """Each engine's kind, in [[gpus]] order (fault indices refer to this list)."""
    default = scenario.workload.model
    return [g.kind(default) for g in scenario.gpus for _ in range(g.count)]


def expand_gpus(scenario: Scenario) -> list[str]:
    """Each engine's kind key (its profile's), in [[gpus]] order."""
    default = scenario.workload.model
    return [kind.key(default) for kind in expand_kinds(scenario)]


def fleet_capacity_rps(scenario: Scenario, profiles: dict[str, GpuTypeProfile]) -> float:
    """Requests/s the fleet sustains for the workload. With several models, the rate at which
    the first model's pool saturates given its share of requests: no pool is offered more
    than its capacity at utilisation 1."""
    keys, kinds = expand_gpus(scenario), expand_kinds(scenario)
    mix = scenario.model_mix()
    if len(mix) == 1:
        return sum(profiles[k].capacity_rps for k in keys)
    pools = dict.fromkeys(mix, 0.0)
    for key, kind in zip(keys, kinds, strict=True):
        if kind.model in pools:
            pools[kind.model] += profiles[key].capacity_rps
    return min(pools[m] / share for m, share in mix.items())


def assign_classes(n: int, shares: list[float], seed: int) -> list[int]:
    """Each request's SLO class index, drawn by the classes' shares (deterministic)."""
    if len(shares) == 1:
        return [0] * n
    rng = random.Random(seed ^ 0x5105)
    return rng.choices(range(len(shares)), weights=shares, k=n)


def assign_request_classes(n: int, scenario: Scenario, model_of: list[int]) -> list[int]:
    """Each request's SLO class index: drawn by the [slo] classes' shares, except that a
    request for a model with its own SLO is in that model's class."""
    drawn = assign_classes(n, scenario.slo.shares(), scenario.seed)
    own = scenario.model_classes()
    if not own:
        return drawn
    by_model = [own.get(name) for name in scenario.model_mix()]
    return [c if by_model[k] is None else by_model[k] for c, k in zip(drawn, model_of, strict=True)]


def assign_models(n: int, scenario: Scenario) -> tuple[list[str], list[int]]:
    """The workload's models and each request's index among them, drawn by their shares."""
    mix = scenario.model_mix()
    return list(mix), assign_classes(n, list(mix.values()), scenario.seed ^ 0x30DE1)


def sim_backends(
    profiles: dict[str, GpuTypeProfile], keys: list[str], kinds: list[EngineKind]
) -> list[Backend]:
    """One backend per engine, its capacity relative to the fastest kind's."""
    fastest = max(p.capacity_rps for p in profiles.values())
    return [
        Backend(
            f"gpu-{i}", key, (kind.model,), capacity=profiles[key].capacity_rps / fastest,
            gpu=kind.gpu, gpus=kind.gpus,
        )
        for i, (key, kind) in enumerate(zip(keys, kinds, strict=True))
    ]  # fmt: skip
