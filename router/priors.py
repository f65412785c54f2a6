"""Starting points for the router's cost model, from the engine model's roofline.

The router learns output lengths online; per-GPU-type token costs start here, so the very
first decisions already know an H100 from an L4. Units are GPU-seconds of the real GPU; a
fleet that runs uniformly slower (the fake engine's time scale) keeps the same ratios."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.router.core.cost import GpuCostPrior
from gpuroute.router.core.latency_prior import LatencyPrior

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams

REFERENCE_PROMPT = 1000
REFERENCE_OUTPUT = 250
REFERENCE_GPU = "H100"  # capacities are relative to it


@dataclass(frozen=True, slots=True)
class GpuPriors:
    cost: GpuCostPrior
    # reference requests/s relative to an H100 (1.0; what `backends[].capacity` is in); a
    # newer, faster type is above 1
    capacity: float
    unloaded_tpot_s: float  # one sequence alone: the floor of time per output token
    latency: LatencyPrior  # what the latency model predicts TTFT and TPOT from


def engine_priors(model_shape: str) -> dict[str, GpuPriors]:
    model = MODELS[model_shape]
    raw = {}
    for name, spec in GPU_SPECS.items():
        try:
            params = EngineParams(spec, model)
        except ValueError:
            continue  # the model does not fit this GPU; a backend of that type is refused
        prefill = params.prefill_s(REFERENCE_PROMPT) / REFERENCE_PROMPT
        decode = params.decode_token_cost_s(REFERENCE_PROMPT, REFERENCE_OUTPUT)
        tpot = params.step_s(1, REFERENCE_PROMPT + REFERENCE_OUTPUT / 2)
        raw[name] = (GpuCostPrior(prefill, decode), tpot, LatencyPrior.from_engine(params))
    per_request = {
        name: prior.seconds(REFERENCE_PROMPT, REFERENCE_OUTPUT)
        for name, (prior, _, _) in raw.items()
    }
    reference = per_request.get(REFERENCE_GPU) or min(per_request.values())
    return {
        name: GpuPriors(prior, reference / per_request[name], tpot, latency)
        for name, (prior, tpot, latency) in raw.items()
    }
