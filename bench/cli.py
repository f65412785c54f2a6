"""`gpuroute bench KIND`: one entry per benchmark (its arguments, and how they become a spec).

Library code takes typed specs, never argparse namespaces; the conversion and its errors
live here."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuroute.bench.targets import BASELINES, EXTRA_BASELINES, BenchError
from gpuroute.testbed.processes import StartError
from rich.console import Console

Report = dict


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Console], Report]


def register(sub) -> None:
    bench = sub.add_parser("bench", help="live benchmarks against HAProxy and NGINX")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="KIND")
    for entry in BENCHES:
        parser = kinds.add_parser(entry.name, help=entry.help)
        entry.add_arguments(parser)
        parser.add_argument("--json", metavar="OUT", help="write results as JSON ('-' = stdout)")
        parser.set_defaults(run=functools.partial(run_bench, entry))


def run_bench(entry: Bench, args: argparse.Namespace) -> int:
    from gpuroute.bench.live import dump

    console = Console(stderr=args.json == "-", width=None if sys.stdout.isatty() else 140)
    try:
        report = entry.run(args, console)
        if args.json:
            dump(report, args.json)
    except StartError as exc:
        print(f"gpuroute bench: error: {exc}", file=sys.stderr)
        return 2
    return 0


# -- live ----------------------------------------------------------------------------------
def _live_arguments(live: argparse.ArgumentParser) -> None:
    live.add_argument(
        "--engines", default="H100:2,A100:4,L4:4", help="GPU:count,... of fake engines"
    )
    live.add_argument("--trace", type=Path, help="trace file (default: built-in synthetic chat)")
    live.add_argument("--format", default="azure", help="azure, mooncake or lengths")
    live.add_argument("--target-utilization", type=float, default=0.85)
    live.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    live.add_argument("--time-scale", type=float, default=2.0, help="engines run this much slower")
    live.add_argument("--policy", action="append", help="our policies to run (repeatable)")
    live.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help="comma list of haproxy, nginx, haproxy-weighted, or 'none'",
    )
    live.add_argument("--no-stream", action="store_true", help="non-streamed requests")
    live.add_argument(
        "--kill", action="append", default=[], metavar="ENGINE@S", help="SIGKILL an engine"
    )
    live.add_argument(
        "--slow", action="append", default=[], metavar="ENGINE@S:FACTOR", help="slow an engine down"
    )
    live.add_argument("--seed", type=int, default=1)
    live.add_argument(
        "--replicas", type=int, default=1, help="router replicas (requests round robin over them)"
    )
    live.add_argument(
        "--no-shared-state", action="store_true", help="replicas do not share state (no Redis)"
    )
    live.add_argument(
        "--redis-outage",
        metavar="AT:FOR",
        help="kill the replicas' Redis at AT s, restart FOR s later",
    )
    live.add_argument("--plot", metavar="OUT.png", help="latency CDF plot (needs matplotlib)")


def live_spec(args: argparse.Namespace):
    from gpuroute.bench.live import LiveBenchSpec, parse_engines, parse_fault

    baselines = [] if args.baselines == "none" else [b for b in args.baselines.split(",") if b]
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
    return LiveBenchSpec(
        engines=engines,
        policies=args.policy or ["least_outstanding_work"],
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
    )


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
    report = run_live_bench(
        spec, lambda t, n: console.print(f"[bold]{t}[/]: replaying {n:,} requests")
    )
    title = (
        f"{report['trace']}: {report['requests']:,} requests at "
        f"{report['rate_rps']} req/s, {len(spec.engines)} engines, "
        f"time scale {spec.time_scale:g}"
    )
    print_table(console, title, report["targets"], LIVE_COLUMNS)
    print_live_notes(console, report["targets"])
    if args.plot:
        from gpuroute.bench.plot import plot_live

        plot_live(report, args.plot)
    return report


# -- overhead ------------------------------------------------------------------------------
def _overhead_arguments(over: argparse.ArgumentParser) -> None:
    over.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    over.add_argument("--rounds", type=int, default=3, help="visits to each target (medians)")


def _overhead(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.overhead import OVERHEAD_COLUMNS, run_overhead
    from gpuroute.bench.tables import print_table

    report = run_overhead(args.duration, console, args.rounds)
    title = "proxy overhead (tiny non-streamed requests)"
    print_table(console, title, report["rows"], OVERHEAD_COLUMNS)
    return report


# -- replicas ------------------------------------------------------------------------------
def _replicas_arguments(reps: argparse.ArgumentParser) -> None:
    reps.add_argument("--replicas", type=int, default=4)
    reps.add_argument("--engines", default="H100:2,A100:4,L4:4")
    reps.add_argument("--duration", type=float, default=90.0)
    reps.add_argument("--time-scale", type=float, default=2.0)
    reps.add_argument("--target-utilization", type=float, default=0.85)


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


# -- tenants -------------------------------------------------------------------------------
def _tenants_arguments(ten: argparse.ArgumentParser) -> None:
    ten.add_argument("--replicas", type=int, default=4)
    ten.add_argument("--engines", default="H100:2,A100:4,L4:4")
    ten.add_argument("--duration", type=float, default=60.0, help="seconds of steady arrivals")
    ten.add_argument("--burst", default="20:40", metavar="FROM:TO", help="bursty's window (s)")
    ten.add_argument("--steady-utilization", type=float, default=0.5)
    ten.add_argument("--burst-utilization", type=float, default=1.0)
    ten.add_argument(
        "--quota-share", type=float, default=0.02, help="bursty's rpm quota, share of capacity"
    )
    ten.add_argument("--time-scale", type=float, default=2.0)
    ten.add_argument(
        "--router-queue",
        action="store_true",
        help="add runs where the routers hold each engine near its throughput knee",
    )


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


# -- global --------------------------------------------------------------------------------
def _global_arguments(glob: argparse.ArgumentParser) -> None:
    glob.add_argument("--regions", type=int, default=20)
    glob.add_argument("--decisions", type=int, default=100_000)


def _global(args: argparse.Namespace, console: Console) -> Report:
    from gpuroute.bench.global_decisions import run_global_bench
    from gpuroute.bench.tables import GLOBAL_COLUMNS, print_table

    if args.regions < 2 or args.decisions < 100:
        raise BenchError("need --regions >= 2 and --decisions >= 100")
    report = run_global_bench(args.regions, args.decisions)
    title = f"global routing decision, {report['regions']} regions"
    print_table(console, title, report["rows"], GLOBAL_COLUMNS)
    return report


# -- fleet ---------------------------------------------------------------------------------
def _fleet_arguments(fleet: argparse.ArgumentParser) -> None:
    fleet.add_argument("--hosts", type=int, default=50, help="simulated GPU hosts (agents)")
    fleet.add_argument("--duration", type=float, default=60.0, help="steady-state seconds")
    fleet.add_argument("--outage", type=float, default=30.0, help="Consul down this long (0: no)")
    fleet.add_argument("--workers", type=int, default=8, help="closed-loop clients")


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


BENCHES = (
    Bench("live", "replay a trace through our router and the baselines", _live_arguments, _live),
    Bench(
        "overhead", "added latency and throughput of each proxy", _overhead_arguments, _overhead
    ),
    Bench(
        "replicas",
        "router replicas over a Consul-discovered fleet: shared vs independent",
        _replicas_arguments,
        _replicas,
    ),
    Bench(
        "tenants",
        "one tenant's burst against another's latency, across replicas",
        _tenants_arguments,
        _tenants,
    ),
    Bench("global", "time one global routing decision", _global_arguments, _global),
    Bench(
        "fleet",
        "Consul-discovered simulated hosts: load staleness, Raft writes, outage",
        _fleet_arguments,
        _fleet,
    ),
)
