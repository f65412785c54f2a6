"""A scenario's request stream, GPU profiles and policy, as a simulator run starts from them
(the live fleet bench replays the same stream)."""

from __future__ import annotations

from gpuroute.router.core.policies import Policy, PolicyFacts, build_policy
from gpuroute.sim.daily import change_clock
from gpuroute.sim.fleet import GpuTypeProfile, fleet_capacity_rps, profile_gpu_types
from gpuroute.sim.scenario import LoadedScenario
from gpuroute.sim.traces import read_trace
from gpuroute.sim.workloads import Workload, synthetic


def prepare_workload(loaded: LoadedScenario) -> tuple[Workload, dict[str, GpuTypeProfile], float]:
    """The scenario's request stream at its target rate, the GPU profiles and that rate."""
    scenario = loaded.scenario
    spec = scenario.workload
    if spec.profile is not None:
        count = spec.max_requests or 0
        if spec.daily is not None:  # as many as the day takes (at most max_requests)
            day = _peak_rate(loaded, None)
            needed = int(spec.daily.expected_requests(day) * 1.05) + 200 if day else 0
            count = min(count, needed) if count else needed
        assert count, "the scenario validator requires max_requests or a daily span"
        workload = synthetic(spec.profile, count, 1.0, scenario.seed)
    else:
        path = loaded.trace_path()
        assert path is not None and spec.format is not None
        workload = read_trace(path, spec.format, scenario.seed)
        if spec.max_requests is not None:
            workload = workload.head(spec.max_requests)
    profiles = profile_gpu_types(scenario, workload)
    natural = (len(workload) - 1) / workload.span_s if workload.span_s > 0 else 1.0
    rate = _peak_rate(loaded, profiles) or natural * (spec.rate_scale or 1.0)
    workload = workload.rescaled(rate / natural)
    if spec.daily is not None:
        arrivals = change_clock(workload.arrivals, spec.daily)
        workload = workload.head(len(arrivals))
        workload.arrivals = arrivals
    return workload, profiles, rate


def _peak_rate(loaded: LoadedScenario, profiles: dict[str, GpuTypeProfile] | None) -> float:
    """The scenario's rate in req/s where it names one (`rate_rps`, or `target_utilization`
    once the GPU types are profiled); 0 where it scales a trace's own rate."""
    spec = loaded.scenario.workload
    if spec.rate_rps is not None:
        return spec.rate_rps
    if spec.target_utilization is not None and profiles is not None:
        return spec.target_utilization * fleet_capacity_rps(loaded.scenario, profiles)
    return 0.0


def build_policy_for(name: str, loaded: LoadedScenario) -> Policy:
    """Policy `name` as the scenario's [router] sets it (the router's one builder)."""
    router = loaded.scenario.router
    return build_policy(name, router.policy_table(name), PolicyFacts(router.gpu_prices))
