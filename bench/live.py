"""`gpuroute bench live`: the same trace through our router, HAProxy and NGINX.

For each target a fresh fleet of fake engines starts (identical GPUs and seeds), the
target starts in front of it, and the trace is replayed open-loop at the requested share
of the fleet's measured capacity. The engines run `time_scale` times slower than the GPUs
they model so a 2-core machine can host the fleet; every latency reported is wall-clock.
`--scenario` runs a simulator scenario's fleet and models instead (bench/live_fleet.py)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from gpuroute.bench.agreement import learned_state
from gpuroute.bench.live_stats import MODEL, served_stats, summarise
from gpuroute.bench.loadgen import Replay
from gpuroute.bench.targets import (
    BASELINES,
    EXTRA_BASELINES,
    BenchError,
    start_baseline,
    start_router,
)
from gpuroute.bench.wrk import ENGINE_CPU, PROXY_CPU  # with --pin (as bench overhead pins them)
from gpuroute.sim.fleet import saturated_throughput
from gpuroute.sim.traces import read_trace
from gpuroute.sim.workloads import Workload, synthetic
from gpuroute.testbed.processes import Child, start_engine, start_redis, wait_http

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" | "slow"
    engine: int
    at_s: float
    factor: float = 1.0


@dataclass
class LiveBenchSpec:
    engines: list[str]  # GPU type per engine, in order
    policies: list[str] = field(default_factory=lambda: ["least_outstanding_work"])
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    trace: Path | None = None
    trace_format: str | None = None
    target_utilization: float = 0.85
    duration_s: float = 120.0
    time_scale: float = 2.0
    stream: bool = True
    stream_interval_ms: float = 50.0
    slo_ttft_s: float = 5.0  # at GPU speed; scaled by time_scale when judged
    slo_tpot_s: float = 0.1
    faults: list[Fault] = field(default_factory=list)
    seed: int = 1
    replicas: int = 1  # router replicas behind a round-robin client (our targets only)
    shared_state: bool = True  # replicas share load and quotas through Redis
    redis_outage: tuple[float, float] | None = None  # (at s, for s): Redis killed, restarted
    pin: bool = False  # every proxy on core 1, the engines on core 0: the same CPU for each
    # another checkout's interpreter: each policy runs under it too (target POLICY@other)
    router_python: str | None = None


OTHER = "@other"  # a policy's target under `router_python`


def parse_engines(text: str) -> list[str]:
    """'H100:2,A100:4' → ['H100', 'H100', 'A100', ...] with clear errors."""
    engines: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        gpu, _, count = part.partition(":")
        if gpu not in GPU_SPECS:
            raise BenchError(f"--engines: unknown GPU type {gpu!r}; known: {', '.join(GPU_SPECS)}")
        if not count.isdigit() or int(count) < 1:
            raise BenchError(f"--engines: {part!r} needs a positive count, as in {gpu}:2")
        engines += [gpu] * int(count)
    if not engines:
        raise BenchError("--engines: give at least one, as in H100:2,A100:4,L4:4")
    return engines


def parse_fault(kind: str, text: str) -> Fault:
    """'3@30' (kill engine 3 at 30 s) or '2@30:20' (engine 2 becomes 20x slower at 30 s)."""
    try:
        engine, _, rest = text.partition("@")
        at, _, factor = rest.partition(":")
        return Fault(kind, int(engine), float(at), float(factor) if factor else 1.0)
    except ValueError:
        raise BenchError(f"--{kind} {text!r}: expected ENGINE@SECONDS[:FACTOR]") from None


def load_workload(spec: LiveBenchSpec) -> tuple[Workload, float]:
    """The trace at its target rate (requests/s, wall-clock) and that rate."""
    if spec.trace is not None:
        workload = read_trace(spec.trace, spec.trace_format or "azure", spec.seed)
    else:
        workload = synthetic("chat", 20_000, 1.0, spec.seed)
    model = MODELS[MODEL]
    capacity = sum(
        saturated_throughput(EngineParams(GPU_SPECS[gpu], model), workload) for gpu in spec.engines
    )
    rate = spec.target_utilization * capacity / spec.time_scale
    natural = (len(workload) - 1) / workload.span_s
    scaled = workload.rescaled(rate / natural)
    count = int(np.searchsorted(scaled.arrivals - scaled.arrivals[0], spec.duration_s))
    return scaled.head(max(count, 1)), rate


async def _redis_outage(spec: LiveBenchSpec, redis: Child, replay: Replay) -> dict:
    """Kill the replicas' Redis at `at` and start it again, on the same port, `for` later."""
    at, duration = spec.redis_outage
    await asyncio.sleep(max(0.0, at - replay.elapsed()))  # scheduled, not a synchronisation
    redis.kill()
    killed = replay.elapsed()
    await asyncio.sleep(duration)  # the outage itself
    restarted = start_redis(redis.log.parent, port=redis.port)
    redis.proc = restarted.proc
    return {
        "redis_killed_at_s": round(killed, 3),
        "redis_restarted_at_s": round(replay.elapsed(), 3),
    }


async def _apply_faults(spec: LiveBenchSpec, engines: list[Child], replay: Replay) -> list[dict]:
    applied = []

    for fault in sorted(spec.faults, key=lambda f: f.at_s):
        await asyncio.sleep(max(0.0, fault.at_s - replay.elapsed()))  # scheduled, not a sync
        child = engines[fault.engine]
        if fault.kind == "kill":
            child.kill()
        else:
            async with aiohttp.ClientSession() as session:
                await session.post(child.url + "/_fault", json={"slow": fault.factor})
        applied.append(
            asdict(fault)
            | {
                "applied_at_s": round(replay.elapsed(), 3),
                "wall": replay.started_wall + replay.elapsed(),
            }
        )
    return applied


def slo_section(spec: LiveBenchSpec) -> str:
    """Our router's [slo]: the bench's SLO, which is at GPU speed, times the time scale, and
    the latency priors slowed down the same way (the engines run that much slower)."""
    k = spec.time_scale
    return (
        f'\n[slo]\ndefault_class = "bench"\nprior_scale = {k}\n'
        f'[[slo.classes]]\nname = "bench"\nttft_s = {spec.slo_ttft_s * k}\n'
        f"tpot_s = {spec.slo_tpot_s * k}\n"
    )


def _start_proxy(
    target: str, spec: LiveBenchSpec, folder: Path, pairs: list, helpers: list[Child]
) -> tuple[Child, list[str]]:
    """The target in front of the engines: a baseline, or our router (with its replicas and
    their Redis, appended to `helpers`); returns it and the replicas' URLs."""
    cpu = PROXY_CPU if spec.pin else None
    if target in BASELINES + EXTRA_BASELINES:
        return start_baseline(target, folder, pairs, cpu=cpu), []
    extra = ("decision_log_sample = 1.0" if spec.faults else "") + slo_section(spec)
    if target.endswith(OTHER) and spec.router_python:  # the policy under another checkout
        other = dict(name="router-other", python=spec.router_python, extra=extra, cpu=cpu)
        return start_router(folder, pairs, target.removesuffix(OTHER), **other), []
    if spec.replicas > 1 and spec.shared_state:
        redis = start_redis(folder)
        helpers.append(redis)
        extra += f'\n[redis]\nurl = "redis://127.0.0.1:{redis.port}/0"\n'
    urls = []
    for k in range(1, spec.replicas):
        replica = start_router(folder, pairs, target, extra=extra, name=f"replica-{k}", cpu=cpu)
        helpers.append(replica)
        wait_http(replica.url + "/v1/models", 30, replica, replica.name)
        urls.append(replica.url)
    return start_router(folder, pairs, target, extra=extra, cpu=cpu), urls


async def run_target(
    target: str,
    spec: LiveBenchSpec,
    workload: Workload,
    workdir: Path,
    on_progress: Callable[[int], None] | None = None,
) -> dict:
    """One target's replay; `on_progress` hears how many requests were sent so far."""
    folder = workdir / target
    folder.mkdir(parents=True, exist_ok=True)
    engines = [
        start_engine(
            folder,
            i,
            gpu,
            time_scale=spec.time_scale,
            stream_interval_ms=spec.stream_interval_ms,
            cpu=ENGINE_CPU if spec.pin else None,
        )
        for i, gpu in enumerate(spec.engines)
    ]
    proxy: Child | None = None
    helpers: list[Child] = []
    try:
        for child in engines:
            wait_http(child.url + "/health", 30, child, child.name)
        pairs = list(zip(spec.engines, engines, strict=True))
        proxy, urls = _start_proxy(target, spec, folder, pairs, helpers)
        wait_http(proxy.url + "/v1/models", 30, proxy, target)
        replay = Replay(
            [proxy.url, *urls], workload, MODEL, stream=spec.stream, on_progress=on_progress
        )
        run = asyncio.create_task(replay.run())
        faults = asyncio.create_task(_apply_faults(spec, engines, replay))
        outage = None
        if spec.redis_outage and helpers and helpers[0].name == "redis":
            outage = asyncio.create_task(_redis_outage(spec, helpers[0], replay))
        results = await run
        applied = await faults if faults.done() else []
        faults.cancel()
        summary = summarise(target, results, spec, workload)
        if target in spec.policies:
            summary["learned"] = await learned_state(proxy.url)
        summary |= await served_stats(
            results, workload, pairs, replay.elapsed(), summary["_span_s"], spec.time_scale
        )
        if outage is not None:
            summary |= await outage
        if spec.faults and target not in BASELINES + EXTRA_BASELINES:
            summary |= await fault_summary(proxy, applied, pairs, results)
        return summary
    finally:
        if proxy is not None:
            proxy.stop()
        for child in helpers:
            child.stop()
        for child in engines:
            child.stop()


async def fault_summary(
    proxy: Child, applied: list[dict], pairs: list[tuple[str, Child]], results: list
) -> dict:
    """Our router around the faults: what it did (its decision log) and its continuations."""
    from gpuroute.bench.fault_report import continuation_stats, fault_report

    return {
        "faults": fault_report(proxy.log, applied, pairs, results),
        "continuations": await continuation_stats(proxy.url),
    }


def run_live_bench(spec: LiveBenchSpec, on_target=None) -> dict:
    """`on_target(target, requests)` hears of each target as its replay starts, and may
    return what hears of its progress (requests sent so far)."""
    workload, rate = load_workload(spec)
    ours = list(spec.policies) + [p + OTHER for p in spec.policies if spec.router_python]
    targets = ours + list(spec.baselines)
    report = {
        "engines": spec.engines,
        "time_scale": spec.time_scale,
        "target_utilization": spec.target_utilization,
        "rate_rps": round(rate, 3),
        "requests": len(workload),
        "duration_s": spec.duration_s,
        "stream": spec.stream,
        "trace": str(spec.trace) if spec.trace else "synthetic chat",
        "targets": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpuroute-bench-") as tmp:
        for target in targets:
            steps = on_target(target, len(workload)) if on_target is not None else None
            result = asyncio.run(run_target(target, spec, workload, Path(tmp), steps))
            report["targets"].append(result)
    return report


def public(value):
    """The report without its private sample arrays (keys starting with '_')."""
    if isinstance(value, dict):
        return {k: public(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [public(v) for v in value]
    return value


def dump(report: dict, out: str) -> None:
    text = json.dumps(public(report), indent=2)
    if out == "-":
        print(text)
    else:
        Path(out).write_text(text + "\n")
