"""Running `gpuroute bench KIND`: the arguments (bench/cli.py) become typed specs, with
clear errors, and the benchmark runs; library code never sees an argparse namespace."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gpuroute.bench.targets import BASELINES, EXTRA_BASELINES, BenchError
from gpuroute.router.core.policies import DEFAULT_ALIAS, resolve_policy_name
from gpuroute.testbed.processes import StartError
from rich.console import Console
from rich.progress import Progress

from gpuroute.console.progress import progress_bar

Report = dict


def run_bench(name: str, args: argparse.Namespace) -> int:
    """Run benchmark `name` (a key of RUNS), print its table, write its JSON."""
    from gpuroute.bench.live import dump

    console = Console(stderr=args.json == "-", width=None if sys.stdout.isatty() else 140)
    try:
        report = RUNS[name](args, console)
        if args.json:
            dump(report, args.json)
    except StartError as exc:
        print(f"gpuroute bench: error: {exc}", file=sys.stderr)
        return 2
    return 0


def replay_steps(
    console: Console, progress: Progress, quiet: bool
) -> Callable[[str, int], Callable[[int], None]]:
    """What `bench live` tells of each target: a line as its replay starts (unless
    `quiet`), then a bar of the requests sent so far."""

    def on_target(target: str, requests: int) -> Callable[[int], None]:
        if not quiet:
            console.print(f"[bold]{target}[/]: replaying {requests:,} requests")
        task = progress.add_task(target, total=requests)
        return lambda sent: progress.update(task, completed=sent)

    return on_target


def answer_steps(progress: Progress, label: str, requests: int) -> Callable[[], None]:
    """`bench real`'s bar for one target and workload: a step per request answered."""
    task = progress.add_task(label, total=requests)
    return lambda: progress.advance(task)


def live_spec(args: argparse.Namespace):
    from gpuroute.bench.live import LiveBenchSpec, parse_engines, parse_fault

    if args.baselines is None:
        baselines = list(BASELINES)
    elif args.baselines == "none":
        baselines = []
    else:
        baselines = [b for b in args.baselines.split(",") if b]
    for name in baselines:
        if name not in BASELINES + EXTRA_BASELINES:
            known = ", ".join(BASELINES + EXTRA_BASELINES)
            raise BenchError(f"--baselines: unknown {name!r}; known: {known}")
    if args.trace is not None and not args.trace.exists():
        raise BenchError(f"--trace: {args.trace} not found")
    faults = [parse_fault("kill", f) for f in args.kill] + [
        parse_fault("slow", f) for f in args.slow
    ]
    engines = parse_engines(args.engines)
    for fault in faults:
        if not 0 <= fault.engine < len(engines):
            raise BenchError(
                f"fault engine index {fault.engine} out of range 0..{len(engines) - 1}"
            )
    if not 0 < args.target_utilization <= 2 or args.duration <= 0 or args.time_scale <= 0:
        raise BenchError("need 0 < --target-utilization <= 2, --duration > 0, --time-scale > 0")
    if args.slo_ttft <= 0 or args.slo_tpot <= 0:
        raise BenchError("--slo-ttft and --slo-tpot must be > 0 (seconds, at GPU speed)")
    return LiveBenchSpec(
        engines=engines,
        policies=policy_names(args.policy),
        slo_ttft_s=args.slo_ttft,
        slo_tpot_s=args.slo_tpot,
        baselines=baselines,
        trace=args.trace,
        trace_format=args.format,
        target_utilization=args.target_utilization,
        duration_s=args.duration,
        time_scale=args.time_scale,
        stream=not args.no_stream,
        faults=faults,
        seed=args.seed,
        replicas=args.replicas,
        shared_state=not args.no_shared_state,
        redis_outage=parse_outage(args.redis_outage),
        pin=args.pin,
        router_python=other_interpreter(args.router_python),
    )


def other_interpreter(path: Path | None) -> str | None:
    """`--router-python`: another checkout's interpreter, checked before anything starts."""
    if path is None:
        return None
    if not path.is_file() or not os.access(path, os.X_OK):
        raise BenchError(f"--router-python {path}: not an executable interpreter")
    return str(path)


def policy_names(names: list[str] | None) -> list[str]:
    """Our policies to run, `default` resolved; BenchError for an unknown one."""
    try:
        return [resolve_policy_name(name) for name in names or [DEFAULT_ALIAS]]
    except ValueError as exc:
        raise BenchError(f"--policy: {exc}") from None


def parse_outage(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        at, duration = (float(x) for x in text.split(":"))
    except ValueError:
        raise BenchError(f"--redis-outage {text!r}: expected AT:FOR in seconds") from None
    if at < 0 or duration <= 0:
        raise BenchError("--redis-outage: AT >= 0 and FOR > 0")
    return at, duration


def _live(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.live import run_live_bench
    from gpuroute.bench.tables import LIVE_COLUMNS, print_live_notes, print_table

    spec = live_spec(args)
    with progress_bar(quiet=args.quiet, mode=args.progress) as progress:
        report = run_live_bench(spec, replay_steps(console, progress, args.quiet))
    title = (
        f"{report['trace']}: {report['requests']:,} requests at "
        f"{report['rate_rps']} req/s, {len(spec.engines)} engines, "
        f"time scale {spec.time_scale:g}"
    )
    print_table(console, title, report["targets"], LIVE_COLUMNS)
    print_live_notes(console, report["targets"])
    if args.sim:
        report["agreement"] = _agreement(spec, report, console)
    if args.plot:
        from gpuroute.bench.plot import plot_live

        plot_live(report, args.plot)
    return report


def _agreement(spec, report: Report, console: Console) -> list[dict]:
    """The simulator on the same fleet, requests and time scale as each of our targets."""
    from gpuroute.bench.agreement import AGREEMENT_COLUMNS, compare, simulate
    from gpuroute.bench.live import load_workload
    from gpuroute.bench.tables import print_table

    workload, _rate = load_workload(spec)
    slo = (spec.slo_ttft_s, spec.slo_tpot_s)
    rows = [
        compare(
            live,
            simulate(
                spec.engines,
                workload,
                spec.time_scale,
                live["target"],
                slo,
                live.get("learned", {}).get("overhead_s"),
            ),
        )
        for live in report["targets"]
        if live["target"] in spec.policies
    ]
    print_table(
        console,
        "simulator against live (same fleet, requests, time scale)",
        rows,
        AGREEMENT_COLUMNS,
    )
    return rows


def _overhead(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.overhead import COST_COLUMNS, OVERHEAD_COLUMNS, run_overhead
    from gpuroute.bench.tables import print_table

    report = run_overhead(
        args.duration, console, args.rounds, tls=args.tls, workers=args.workers,
        other_python=args.router_python,
    )  # fmt: skip
    title = "proxy overhead (tiny non-streamed requests)"
    print_table(console, title, report["rows"], OVERHEAD_COLUMNS)
    every, sampled = report["observed"]["gpuroute-observed"], report["observed"]["gpuroute-sampled"]
    title = (
        "tracing + access log on every request (gpuroute-observed: "
        f"{every['spans']:,} spans exported, {every['access_lines']:,} access lines) "
        "and sampled (gpuroute-sampled: 1 trace in 10, the default access log: "
        f"{sampled['spans']:,} spans, {sampled['access_lines']:,} lines) against both off "
        "(gpuroute-quiet)"
    )
    print_table(console, title, report["observability_cost"], COST_COLUMNS)
    if (scaling := report["scaling"]) is not None:
        from gpuroute.bench.scaling import SCALING_COLUMNS

        title = "router workers (unpinned; engine and wrk on core 0), 32 connections"
        print_table(console, title, scaling["rows"], SCALING_COLUMNS)
        console.print(f"shared-view exchange per worker: {scaling['board']}")
    return report


def _stream(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.stream import STREAM_COLUMNS, run_stream_bench
    from gpuroute.bench.tables import print_table

    try:
        counts = [int(n) for n in args.streams.split(",")]
    except ValueError:
        raise BenchError(
            f"--streams: expected a comma list of numbers, got {args.streams!r}"
        ) from None
    if min(counts) < 1 or args.tokens < 2 or args.rounds < 1 or args.token_interval_ms <= 0:
        raise BenchError("need --streams >= 1, --tokens >= 2, --rounds >= 1, an interval > 0")
    targets = [t for t in args.targets.split(",") if t]
    report = run_stream_bench(targets, counts, args.tokens, args.token_interval_ms, args.rounds)
    title = f"stream relay: {args.tokens} tokens per stream, one per event, every "
    print_table(console, title + f"{args.token_interval_ms:g} ms", report["rows"], STREAM_COLUMNS)
    return report


def _replicas(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.live import LiveBenchSpec, parse_engines
    from gpuroute.bench.replicas import run_replicas_bench
    from gpuroute.bench.tables import LIVE_COLUMNS, print_table

    if args.replicas < 2:
        raise BenchError("--replicas must be at least 2")
    spec = LiveBenchSpec(
        engines=parse_engines(args.engines),
        duration_s=args.duration,
        time_scale=args.time_scale,
        target_utilization=args.target_utilization,
        replicas=args.replicas,
    )
    report = run_replicas_bench(spec, Path("out/bench-replicas"))
    print_table(console, f"{args.replicas} router replicas", report["targets"], LIVE_COLUMNS)
    if "p99_independent_over_shared" in report:
        cvs = ", ".join(f"{t['target']}: {t['gpu_busy_cv']}" for t in report["targets"])
        console.print(
            f"E2E p99 independent / shared = {report['p99_independent_over_shared']}; "
            f"GPU busy CV {cvs}"
        )
    return report


def tenants_spec(args: argparse.Namespace, engines: list[str]):
    """The spec from `gpuroute bench tenants` arguments, with clear errors."""
    from gpuroute.bench.tenants import TenantsSpec

    try:
        start, end = (float(x) for x in args.burst.split(":"))
    except ValueError:
        raise BenchError(f"--burst {args.burst!r}: expected FROM:TO in seconds") from None
    if not 0 <= start < end <= args.duration:
        raise BenchError("--burst: need 0 <= FROM < TO <= --duration")
    if args.replicas < 1 or args.time_scale <= 0:
        raise BenchError("need --replicas >= 1 and --time-scale > 0")
    for name in ("steady_utilization", "burst_utilization", "quota_share"):
        if not 0 < getattr(args, name) <= 2:
            raise BenchError(f"--{name.replace('_', '-')}: need a share in (0, 2]")
    return TenantsSpec(
        engines, replicas=args.replicas, duration_s=args.duration, burst_from_s=start,
        burst_to_s=end, steady_utilization=args.steady_utilization,
        burst_utilization=args.burst_utilization, quota_share=args.quota_share,
        time_scale=args.time_scale, router_queue=args.router_queue,
    )  # fmt: skip


def _tenants(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.live import parse_engines
    from gpuroute.bench.tenants import print_tenants, run_tenants_bench

    spec = tenants_spec(args, parse_engines(args.engines))
    report = run_tenants_bench(spec, lambda run: console.print(f"[bold]{run}[/]"))
    print_tenants(console, report)
    return report


def _global(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.global_decisions import run_global_bench
    from gpuroute.bench.tables import GLOBAL_COLUMNS, print_table

    if args.regions < 2 or args.decisions < 100:
        raise BenchError("need --regions >= 2 and --decisions >= 100")
    report = run_global_bench(args.regions, args.decisions)
    title = f"global routing decision, {report['regions']} regions"
    print_table(console, title, report["rows"], GLOBAL_COLUMNS)
    return report


def _decide(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.decisions import DECIDE_COLUMNS, run_decide_bench
    from gpuroute.bench.tables import print_table

    if args.backends < 1 or args.decisions < 100:
        raise BenchError("need --backends >= 1 and --decisions >= 100")
    report = run_decide_bench(args.backends, args.decisions, policy_names(args.policy))
    other = other_interpreter(args.router_python)
    if other is not None:  # the same bench under another checkout, in this run
        report["rows"] += other_decide_rows(other, args)
    title = f"routing decision in the core, {report['backends']} backends"
    print_table(console, title, report["rows"], DECIDE_COLUMNS)
    return report


def _fleet(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.fleet import FleetBenchSpec, run_fleet_bench
    from gpuroute.bench.tables import print_fleet

    if args.hosts < 1 or args.duration <= 0 or args.outage < 0 or args.workers < 1:
        raise BenchError("need --hosts >= 1, --duration > 0, --outage >= 0, --workers >= 1")
    spec = FleetBenchSpec(args.hosts, args.duration, args.outage, args.workers)
    console.print(f"[bold]fleet[/]: {spec.hosts} simulated hosts, Consul dev agent")
    report = run_fleet_bench(spec)
    print_fleet(console, report)
    return report


def _real(args: argparse.Namespace, console: Console) -> Report:
    import tempfile

    from gpuroute.bench.real_engine import REAL_COLUMNS, RealRun, run_real_bench
    from gpuroute.bench.tables import print_table

    if args.scale < 1 or args.workers < 1:
        raise BenchError("need --scale >= 1 and --workers >= 1")
    targets, workloads = args.targets.split(","), args.workloads.split(",")
    with (
        progress_bar(quiet=args.quiet, mode=args.progress) as progress,
        tempfile.TemporaryDirectory(prefix="gpuroute-bench-real-") as tmp,
    ):
        steps = functools.partial(answer_steps, progress)
        run = RealRun(args.seed, args.scale, args.workers, on_measure=steps)
        report = run_real_bench(targets, workloads, Path(tmp), run)
    title = "two real vLLM servers (CPU build, tiny model), every request streamed"
    print_table(console, title, report["rows"], REAL_COLUMNS)
    return report


RUNS: dict[str, Callable[[argparse.Namespace, Console], Report]] = {
    "live": _live,
    "overhead": _overhead,
    "stream": _stream,
    "replicas": _replicas,
    "tenants": _tenants,
    "global": _global,
    "decide": _decide,
    "real": _real,
    "fleet": _fleet,
}


def other_decide_rows(python: str, args: argparse.Namespace) -> list[dict]:
    """`bench decide` under another checkout's interpreter; its rows, policies marked @other."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "other.json"
        command = [
            python,
            "-m",
            "gpuroute.cli",
            "bench",
            "decide",
            "--backends",
            str(args.backends),
            "--decisions",
            str(args.decisions),
            "--json",
            str(out),
        ]
        for name in args.policy or ["default"]:
            command += ["--policy", name]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=folder)
        if done.returncode != 0:
            raise BenchError(f"--router-python {python}: bench decide failed: {done.stderr[-500:]}")
        rows = json.loads(out.read_text())["rows"]
    return [row | {"policy": f"{row['policy']}@other"} for row in rows]
