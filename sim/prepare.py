"""A scenario's request stream, GPU profiles and policy, as a simulator run starts from them
(the live fleet bench replays the same stream)."""

from __future__ import annotations

from gpuroute.router.core.policies import PolicyOptions, build_policy
from gpuroute.sim.fleet import GpuTypeProfile, fleet_capacity_rps, profile_gpu_types
from gpuroute.sim.scenario import LoadedScenario
from gpuroute.sim.traces import read_trace
from gpuroute.sim.workloads import Workload, synthetic


def prepare_workload(loaded: LoadedScenario) -> tuple[Workload, dict[str, GpuTypeProfile], float]:
    """The scenario's request stream at its target rate, the GPU profiles and that rate."""
    scenario = loaded.scenario
    spec = scenario.workload
    if spec.profile is not None:
        assert spec.max_requests is not None  # the scenario validator guarantees it
        workload = synthetic(spec.profile, spec.max_requests, 1.0, scenario.seed)
    else:
        path = loaded.trace_path()
        assert path is not None and spec.format is not None
        workload = read_trace(path, spec.format, scenario.seed)
        if spec.max_requests is not None:
            workload = workload.head(spec.max_requests)
    profiles = profile_gpu_types(scenario, workload)
    natural = (len(workload) - 1) / workload.span_s if workload.span_s > 0 else 1.0
    if spec.target_utilization is not None:
        rate = spec.target_utilization * fleet_capacity_rps(scenario, profiles)
    elif spec.rate_scale is not None:
        rate = natural * spec.rate_scale
    else:
        assert spec.rate_rps is not None
        rate = spec.rate_rps
    return workload.rescaled(rate / natural), profiles, rate


def build_policy_for(name: str, loaded: LoadedScenario):
    router = loaded.scenario.router
    options = PolicyOptions(
        router.full_scan_max,
        router.choices,
        gpu_prices=router.gpu_prices or None,
        cost_weight=router.cost_weight,
        slo_margin=router.slo_margin,
    )
    return build_policy(name, options)
