"""Discrete-event fleet simulator driving the router's own scheduling core.

Arrivals go through `Scheduler.route` exactly as in the live router; engines are
EngineModel instances; completions go back through `Scheduler.finish` at end-of-stream.
A request that fails before its first token is retried on another backend (up to
`MAX_RETRIES`), as the live router does; one that fails mid-stream counts as failed."""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable

from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.policies import PolicyOptions, build_policy
from gpuroute.router.core.scheduler import Outcome
from gpuroute.sim.engine_model import EngineModel, EngineRequest
from gpuroute.sim.fleet import (
    GpuTypeProfile,
    expand_gpus,
    fleet_capacity_rps,
    profile_gpu_types,
    request_work,
)
from gpuroute.sim.report import (
    FAILED,
    OK,
    PENDING,
    REJECTED,
    PolicyReport,
    RunOutcomes,
    summarise,
)
from gpuroute.sim.scenario import LoadedScenario
from gpuroute.sim.traces import read_trace
from gpuroute.sim.workloads import Workload, synthetic

MAX_RETRIES = 2
TICK, FAULT = -1, -2


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
    return build_policy(name, PolicyOptions(router.full_scan_max, router.choices))


class FleetSimulator:
    def __init__(self, loaded: LoadedScenario) -> None:
        self.loaded = loaded
        self.scenario = loaded.scenario
        self.workload, self.profiles, self.rate_rps = prepare_workload(loaded)
        self.gpu_types = expand_gpus(self.scenario)

    def run(self, policy_name: str, progress: Callable[[int], None] | None = None) -> PolicyReport:
        started = time.perf_counter()
        scenario, workload, profiles = self.scenario, self.workload, self.profiles
        model = scenario.workload.model
        fastest = max(p.capacity_rps for p in profiles.values())
        engines = [
            EngineModel(profiles[t].params, prefix_caching=scenario.prefix_caching)
            for t in self.gpu_types
        ]
        backends = [
            Backend(f"gpu-{i}", t, (model,), capacity=profiles[t].capacity_rps / fastest)
            for i, t in enumerate(self.gpu_types)
        ]
        index_of = {b.backend_id: i for i, b in enumerate(backends)}
        oracle = scenario.router.oracle_output_lengths
        estimator = CostEstimator(
            {t: p.prior for t, p in profiles.items()}, exact_max_tokens=oracle
        )
        scheduler = Scheduler(
            BackendSet(backends), build_policy_for(policy_name, self.loaded), estimator
        )
        rng = random.Random(scenario.seed)

        n = len(workload)
        run = RunOutcomes.pending(n)
        arrivals = workload.arrivals.tolist()
        prompts = workload.prompts.tolist()
        outputs = workload.outputs.tolist()
        blocks, sessions = workload.blocks, workload.sessions
        work = [0.0] * len(engines)
        engine_profiles = [profiles[t] for t in self.gpu_types]
        # Step time over batch measures throughput cost only near saturation; at low load it
        # overstates it (and would starve the GPU that looks expensive), so learn from busy GPUs.
        busy_batch = [profiles[t].saturation_batch // 2 for t in self.gpu_types]
        infos: dict[int, RequestInfo] = {}
        tried: dict[int, set[str]] = {}

        heap: list[tuple[float, int, int, int]] = []
        versions = [0] * len(engines)
        seq = 0
        tick_s = scenario.router.health_tick_s
        start = arrivals[0] if n else 0.0
        heap.append((start, seq, TICK, 0))
        faults = sorted(scenario.faults, key=lambda f: f.at_s)
        for k, fault in enumerate(faults):
            seq += 1
            heap.append((start + fault.at_s, seq, FAULT, k))
        heapq.heapify(heap)

        def reschedule(e: int) -> None:
            nonlocal seq
            versions[e] += 1
            t_next = engines[e].next_event_time()
            if t_next is not None:
                seq += 1
                heapq.heappush(heap, (t_next, seq, e, versions[e]))

        def dispatch(info: RequestInfo, now: float) -> None:
            rid = info.request_id
            while True:
                decision = scheduler.route(info, now, rng, tried.get(rid, ()))
                if decision is None:
                    run.status[rid] = FAILED if rid in tried else REJECTED
                    return
                e = index_of[decision.backend.backend_id]
                engine = engines[e]
                req = EngineRequest(rid, prompts[rid], outputs[rid], arrivals[rid], blocks[rid])
                if not engine.fits(req):
                    scheduler.release(rid)
                    run.status[rid] = REJECTED
                    return
                if engine.submit(req, now):
                    reschedule(e)
                    return
                # Engine down: connection refused before any byte; count and retry elsewhere.
                scheduler.finish(rid, model, Outcome(False), now)
                seen = tried.setdefault(rid, set())
                seen.add(decision.backend.backend_id)
                if len(seen) > MAX_RETRIES:
                    run.status[rid] = FAILED
                    return
                run.retries += 1

        def complete(req: EngineRequest, e: int, now: float) -> None:
            rid = req.rid
            engine = engines[e]
            prefill = None
            if req.cached_tokens == 0 and req.admitted_at == req.arrival:
                prefill = (req.first_token_at - req.admitted_at) / req.prompt_tokens
            batch = engine.batch + 1
            outcome = Outcome(
                True,
                req.output_tokens,
                req.prompt_tokens,
                prefill_s_per_token=prefill,
                decode_s_per_token=engine.step / batch if batch >= busy_batch[e] else None,
            )
            scheduler.finish(rid, model, outcome, now)
            run.status[rid] = OK
            run.ttft[rid] = req.first_token_at - req.arrival
            run.finish[rid] = now
            run.served_by[rid] = e
            work[e] += request_work(
                engine_profiles[e], req.prompt_tokens - req.cached_tokens, req.output_tokens
            )
            infos.pop(rid, None)
            tried.pop(rid, None)

        def apply_fault(fault, now: float) -> None:
            engine = engines[fault.gpu]
            if fault.kind == "slow":
                engine.set_slowdown(fault.factor, now)
            elif fault.kind == "recover":
                engine.set_slowdown(1.0, now)
                engine.recover(now)
            else:
                for req in engine.crash(now):
                    scheduler.finish(req.rid, model, Outcome(False), now)
                    info = infos.get(req.rid)
                    if req.first_token_at < 0 and info is not None:
                        # Nothing reached the client yet: the router retries elsewhere.
                        tried.setdefault(req.rid, set()).add(backends[fault.gpu].backend_id)
                        run.retries += 1
                        dispatch(info, now)
                    else:
                        run.status[req.rid] = FAILED
                        infos.pop(req.rid, None)
            reschedule(fault.gpu)

        i = 0
        report_every = max(n // 100, 1)
        while i < n or heap:
            t_arrival = arrivals[i] if i < n else math.inf
            if heap and heap[0][0] <= t_arrival:
                now, _, e, version = heapq.heappop(heap)
                if e >= 0:
                    if version == versions[e]:
                        for req in engines[e].on_event(now):
                            complete(req, e, now)
                        reschedule(e)
                elif e == TICK:
                    scheduler.tick(now)
                    if i < n or len(scheduler.ledger):
                        seq += 1
                        heapq.heappush(heap, (now + tick_s, seq, TICK, 0))
                else:
                    apply_fault(faults[version], now)
                continue
            info = RequestInfo(
                i,
                model,
                prompts[i],
                outputs[i] if oracle else None,
                session_id=sessions[i],
                prefix_blocks=blocks[i],
            )
            infos[i] = info
            dispatch(info, t_arrival)
            if run.status[i] != PENDING:
                infos.pop(i, None)
            i += 1
            if progress is not None and i % report_every == 0:
                progress(i)
        if progress is not None:
            progress(n)
        return summarise(
            policy_name,
            scenario,
            workload,
            run,
            engines,
            work,
            wall_s=time.perf_counter() - started,
        )
