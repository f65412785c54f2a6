"""`gpuroute bench live --scenario FILE`: the live benchmark on a scenario's fleet.

One fake engine per engine of the scenario's `[[gpus]]` groups, each running its group's
GPU type (a declared one is read from the scenario's `[[gpu_types]]`), tensor-parallel
degree and model shape, serving that model's name; in front of them our router, whose
config carries the scenario's `[[gpu_types]]`, `[[models]]` (shapes, fallbacks) and one
`[[backends]]` per engine with its GPU, model and degree. The scenario's workload (its
synthetic profile or trace) is replayed with each request's model and SLO class drawn from
`workload.models` and `[slo]` exactly as the simulator draws them (the scenario's seed), at
`target_utilization` × the fleet's capacity for that model mix (sim/fleet.py), divided by
the time scale. Each request is judged on its own class; per model, the report counts the
requests a fallback model served (our router's x-gpuroute-served-model)."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gpuroute.bench.agreement import learned_state
from gpuroute.bench.live import LiveBenchSpec
from gpuroute.bench.live_stats import served_stats, summarise
from gpuroute.bench.loadgen import Replay, RequestResult
from gpuroute.bench.targets import BASELINES, BenchError, start_baseline
from gpuroute.bench.wrk import ENGINE_CPU, PROXY_CPU
from gpuroute.router.core.slo import SloClass, time_per_output_token
from gpuroute.sim.fleet import (
    GpuTypeProfile,
    assign_classes,
    assign_models,
    expand_kinds,
    fleet_capacity_rps,
)
from gpuroute.sim.prepare import prepare_workload
from gpuroute.sim.run import resolve_scenario
from gpuroute.sim.scenario import LoadedScenario, Scenario
from gpuroute.sim.traces import TraceError
from gpuroute.sim.workloads import Workload
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, spawn, start_engine, wait_http

from gpuroute.roofline import EngineKind
from gpuroute.stats import percentile

ENGINE_START_S = 60.0  # a dozen engines importing at once on two cores
# HAProxy and NGINX balance connections; the body's `model` is beyond them
MANY_MODELS_NOTE = (
    "{baselines} skipped: the scenario serves {n} models and a connection balancer cannot "
    "route by the body's `model` (each engine serves one)"
)


@dataclass
class FleetBenchSpec:
    scenario: str  # a scenario file, or the name of one in sim/scenarios
    policies: list[str] = field(default_factory=lambda: ["least_outstanding_work"])
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    target_utilization: float = 0.85
    duration_s: float = 60.0
    time_scale: float = 2.0
    stream: bool = True
    stream_interval_ms: float = 50.0
    pin: bool = False  # every proxy on core 1, the engines on core 0


@dataclass
class Fleet:
    """A scenario's fleet as the live bench runs it."""

    loaded: LoadedScenario
    kinds: list[EngineKind]  # each engine's, in [[gpus]] order
    keys: list[str]  # each engine's kind key (what its profile and tables call it)
    profiles: dict[str, GpuTypeProfile]  # by kind key
    capacity_rps: float  # the model mix's, at GPU speed
    classes: list[SloClass]  # the scenario's [slo], at GPU speed

    @property
    def scenario(self) -> Scenario:
        return self.loaded.scenario

    @property
    def models(self) -> list[str]:
        return list(self.scenario.model_mix())

    @property
    def specs_file(self) -> Path | None:
        """What the engines read their declared GPU types and shapes from (the scenario)."""
        declares = self.scenario.gpu_types or self.scenario.models
        return Path(self.loaded.source).resolve() if declares else None

    def request_models(self, n: int) -> list[str]:
        names, index = assign_models(n, self.scenario)
        return [names[k] for k in index]

    def request_classes(self, n: int) -> list[int]:
        return assign_classes(n, self.scenario.slo.shares(), self.scenario.seed)


def load_fleet(spec: FleetBenchSpec) -> tuple[Fleet, Workload, float]:
    """The scenario's fleet, its workload cut to `duration_s` at the bench's rate, and that
    rate (requests/s, wall-clock). BenchError for a scenario the bench cannot run."""
    loaded = resolve_scenario(spec.scenario)
    scenario = loaded.scenario
    if scenario.global_ is not None:
        raise BenchError(f"--scenario {spec.scenario}: [global] scenarios are not run live")
    for i, group in enumerate(scenario.gpus):
        if group.pipeline_parallel != 1:
            raise BenchError(f"--scenario: gpus[{i}].pipeline_parallel: the fake engine has none")
    try:
        workload, profiles, sim_rate = prepare_workload(loaded)
    except TraceError as exc:
        raise BenchError(f"{loaded.source}: workload.trace: {exc}") from None
    kinds = expand_kinds(scenario)
    keys = [kind.key(scenario.workload.model) for kind in kinds]
    capacity = fleet_capacity_rps(scenario, profiles)
    fleet = Fleet(loaded, kinds, keys, profiles, capacity, scenario.slo.slo_classes())
    rate = spec.target_utilization * capacity / spec.time_scale
    scaled = workload.rescaled(rate / sim_rate)
    count = int(np.searchsorted(scaled.arrivals - scaled.arrivals[0], spec.duration_s))
    return fleet, scaled.head(max(count, 1)), rate


# -- our router's config -------------------------------------------------------------------
def toml_value(value: object) -> str:
    """A value as TOML writes it (strings, numbers, booleans, lists, inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    raise TypeError(f"no TOML form for {value!r}")


def toml_entries(table: str, entries: list[dict]) -> list[str]:
    """`[[table]]` once per entry."""
    lines = []
    for entry in entries:
        lines.append(f"[[{table}]]")
        lines += [f"{key} = {toml_value(value)}" for key, value in entry.items()]
    return lines


def slo_lines(fleet: Fleet, time_scale: float) -> list[str]:
    """The scenario's [slo] classes and cost settings; times, and the priors, slowed down by
    the time scale (the engines run that much slower)."""
    router, k = fleet.scenario.router, time_scale
    lines = [
        "[slo]", f"default_class = {toml_value(fleet.classes[0].name)}", f"prior_scale = {k}",
        f"cost_weight = {router.cost_weight}", f"margin = {router.slo_margin}",
    ]  # fmt: skip
    if router.gpu_prices:
        lines.append(f"gpu_prices = {toml_value(dict(router.gpu_prices))}")
    classes = [
        {"name": c.name, "ttft_s": c.ttft_s * k, "tpot_s": c.tpot_s * k}
        | ({} if c.e2e_s is None else {"e2e_s": c.e2e_s * k})
        for c in fleet.classes
    ]
    return lines + toml_entries("slo.classes", classes)


def fleet_router_config(
    fleet: Fleet, engines: list[Child], port: int, policy: str, k: float
) -> str:
    """Our router in front of the fleet: the scenario's GPU types, models and SLO classes,
    and one backend per engine with its GPU type, model and tensor-parallel degree."""
    scenario = fleet.scenario
    lines = [ROUTER_ON_LOOPBACK + f"policy = {toml_value(policy)}"]
    lines += slo_lines(fleet, k)
    lines += ["[retry]", f"rescue_slowness = {scenario.router.rescue_slowness}"]
    lines += ["[listen]", f"port = {port}"]
    # the baselines wait 900 s for a backend; so do we (see bench/targets.py router_config)
    lines += ["[limits]", "first_byte_timeout_s = 900.0", "max_connections_per_ip = 65536"]
    lines += toml_entries(
        "gpu_types", [t.model_dump(exclude_none=True) for t in scenario.gpu_types]
    )
    models = [m.model_dump(exclude_none=True, exclude_defaults=True) for m in scenario.models]
    lines += toml_entries("models", models)
    backends = [
        {"url": child.url, "gpu": kind.gpu, "models": [kind.model], "tensor_parallel": kind.tp}
        for kind, child in zip(fleet.kinds, engines, strict=True)
    ]
    return "\n".join(lines + toml_entries("backends", backends)) + "\n"


# -- one target ----------------------------------------------------------------------------
def start_engines(spec: FleetBenchSpec, fleet: Fleet, folder: Path) -> list[Child]:
    return [
        start_engine(
            folder, i, kind.gpu, time_scale=spec.time_scale,
            stream_interval_ms=spec.stream_interval_ms, cpu=ENGINE_CPU if spec.pin else None,
            model=kind.model, tensor_parallel=kind.tp, specs=fleet.specs_file,
        )
        for i, kind in enumerate(fleet.kinds)
    ]  # fmt: skip


def start_target(
    target: str, spec: FleetBenchSpec, fleet: Fleet, folder: Path, engines: list[Child]
) -> Child:
    """A baseline (one model: every engine serves it), or our router with policy `target`."""
    cpu = PROXY_CPU if spec.pin else None
    if target not in spec.policies:
        pairs = [(kind.gpu, child) for kind, child in zip(fleet.kinds, engines, strict=True)]
        return start_baseline(target, folder, pairs, cpu=cpu)
    port = free_port()
    path = folder / f"router-{target}.toml"
    path.write_text(fleet_router_config(fleet, engines, port, target, spec.time_scale))
    cmd = [sys.executable, "-m", "gpuroute.cli", "router", "--config", str(path)]
    return spawn(f"router-{target}", cmd, folder, port, cpu=cpu)


def slo_judge(fleet: Fleet, class_of: list[int], k: float) -> Callable[[RequestResult], bool]:
    """Whether a served request met its own SLO class (at GPU speed: times over `k`)."""

    def met(r: RequestResult) -> bool:
        tpot = time_per_output_token(r.ttft_s, r.e2e_s, r.output_tokens)
        slo = fleet.classes[class_of[r.index]]
        return slo.met(r.ttft_s / k, None if tpot is None else tpot / k, r.e2e_s / k)

    return met


def by_group(
    results: list[RequestResult],
    group_of: list[str],
    asked: list[str],
    met: Callable[[RequestResult], bool],
) -> dict[str, dict]:
    """Per group (each request's model, or SLO class): requests, completions, attainment
    on each request's class, TTFT p50, and how many a model other than the one the request
    `asked` for served (a fallback)."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(group_of[r.index] for r in results):
        mine = [r for r in results if group_of[r.index] == name]
        ok = [r for r in mine if r.ok]
        ttft = [r.ttft_s for r in ok]
        out[name] = {
            "requests": len(mine),
            "completed": len(ok),
            "failed": len(mine) - len(ok),
            "slo_attainment": round(sum(map(met, ok)) / max(len(mine), 1), 4),
            "ttft_p50_s": round(percentile(ttft, 50), 4) if ttft else float("nan"),
            "served_by_fallback": sum(r.served_model not in (None, asked[r.index]) for r in ok),
        }
    return out


async def run_fleet_target(
    target: str,
    spec: FleetBenchSpec,
    fleet: Fleet,
    workload: Workload,
    workdir: Path,
    on_progress: Callable[[int], None] | None = None,
) -> dict:
    folder = workdir / target
    folder.mkdir(parents=True, exist_ok=True)
    engines = start_engines(spec, fleet, folder)
    proxy: Child | None = None
    try:
        for child in engines:
            wait_http(child.url + "/health", ENGINE_START_S, child, child.name)
        proxy = start_target(target, spec, fleet, folder, engines)
        wait_http(proxy.url + "/v1/models", 30, proxy, target)
        n = len(workload)
        models, class_of = fleet.request_models(n), fleet.request_classes(n)
        names = [fleet.classes[c].name for c in class_of]
        replay = Replay(proxy.url, workload, fleet.scenario.workload.model, stream=spec.stream,
                        models=models, slo_classes=names, on_progress=on_progress)  # fmt: skip
        results = await replay.run()
        met = slo_judge(fleet, class_of, spec.time_scale)
        live = LiveBenchSpec(engines=fleet.keys, time_scale=spec.time_scale)
        summary = summarise(target, results, live, workload, met)
        pairs = list(zip(fleet.keys, engines, strict=True))
        summary["by_model"] = by_group(results, models, models, met)
        if len(fleet.classes) > 1:
            summary["by_slo_class"] = by_group(results, names, models, met)
        if target in spec.policies:
            summary["learned"] = await learned_state(proxy.url)
        span, elapsed = summary["_span_s"], replay.elapsed()
        summary |= await served_stats(
            results, workload, pairs, elapsed, span, spec.time_scale, fleet.profiles
        )
        return summary
    finally:
        if proxy is not None:
            proxy.stop()
        for child in engines:
            child.stop()


def fleet_targets(spec: FleetBenchSpec, fleet: Fleet) -> tuple[list[str], list[str]]:
    """The targets to run, and notes on the ones left out (why)."""
    notes = []
    baselines = list(spec.baselines)
    if baselines and len(fleet.models) > 1:
        notes.append(MANY_MODELS_NOTE.format(baselines=", ".join(baselines), n=len(fleet.models)))
        baselines = []
    return [*spec.policies, *baselines], notes


def run_fleet_bench(spec: FleetBenchSpec, on_target=None) -> dict:
    fleet, workload, rate = load_fleet(spec)
    targets, notes = fleet_targets(spec, fleet)
    scenario = fleet.scenario
    report = {
        "scenario": scenario.name,
        "engines": fleet.keys,
        "models": scenario.model_mix(),
        "slo_classes": [c.name for c in fleet.classes],
        "time_scale": spec.time_scale,
        "target_utilization": spec.target_utilization,
        "capacity_rps": round(fleet.capacity_rps, 3),  # at GPU speed
        "rate_rps": round(rate, 3),
        "requests": len(workload),
        "duration_s": spec.duration_s,
        "stream": spec.stream,
        "trace": f"scenario {scenario.name}",
        "notes": notes,
        "targets": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpuroute-bench-fleet-") as tmp:
        for target in targets:
            steps = on_target(target, len(workload)) if on_target is not None else None
            result = asyncio.run(run_fleet_target(target, spec, fleet, workload, Path(tmp), steps))
            report["targets"].append(result)
    return report
