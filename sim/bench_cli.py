"""Command-line glue for `gpuroute bench live` and `gpuroute bench overhead`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuroute.sim.proxies import BASELINES, EXTRA_BASELINES, BenchError
from rich.console import Console
from rich.table import Table

LIVE_COLUMNS = (
    ("target", "target", "{}"),
    ("completed", "done", "{:,}"),
    ("failed", "fail", "{:,}"),
    ("ttft_p50_s", "TTFT p50", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99", "{:.3f}"),
    ("e2e_p50_s", "E2E p50", "{:.2f}"),
    ("e2e_p99_s", "E2E p99", "{:.2f}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("goodput_rps", "goodput", "{:.2f}"),
)


GLOBAL_COLUMNS = (
    ("policy", "target", "{}"),
    ("decisions", "decisions", "{:,}"),
    ("p50_us", "p50 µs", "{:.1f}"),
    ("p99_us", "p99 µs", "{:.1f}"),
    ("p999_us", "p99.9 µs", "{:.1f}"),
    ("p99_vs_nearest", "p99 ÷ nearest", "{:.2f}"),
)


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="live benchmarks against HAProxy and NGINX")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="KIND")
    live = kinds.add_parser("live", help="replay a trace through our router and the baselines")
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
    live.add_argument("--json", metavar="OUT", help="write results as JSON ('-' = stdout)")
    live.add_argument("--plot", metavar="OUT.png", help="latency CDF plot (needs matplotlib)")

    over = kinds.add_parser("overhead", help="added latency and throughput of each proxy")
    over.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    over.add_argument("--rounds", type=int, default=3, help="visits to each target (medians)")
    over.add_argument("--json", metavar="OUT")

    reps = kinds.add_parser(
        "replicas", help="router replicas over a Consul-discovered fleet: shared vs independent"
    )
    reps.add_argument("--replicas", type=int, default=4)
    reps.add_argument("--engines", default="H100:2,A100:4,L4:4")
    reps.add_argument("--duration", type=float, default=90.0)
    reps.add_argument("--time-scale", type=float, default=2.0)
    reps.add_argument("--target-utilization", type=float, default=0.85)
    reps.add_argument("--json", metavar="OUT")

    ten = kinds.add_parser(
        "tenants", help="one tenant's burst against another's latency, across replicas"
    )
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
    ten.add_argument("--json", metavar="OUT")

    glob = kinds.add_parser("global", help="time one global routing decision")
    glob.add_argument("--regions", type=int, default=20)
    glob.add_argument("--decisions", type=int, default=100_000)
    glob.add_argument("--json", metavar="OUT")

    fleet = kinds.add_parser(
        "fleet", help="Consul-discovered simulated hosts: load staleness, Raft writes, outage"
    )
    fleet.add_argument("--hosts", type=int, default=50, help="simulated GPU hosts (agents)")
    fleet.add_argument("--duration", type=float, default=60.0, help="steady-state seconds")
    fleet.add_argument("--outage", type=float, default=30.0, help="Consul down this long (0: no)")
    fleet.add_argument("--workers", type=int, default=8, help="closed-loop clients")
    fleet.add_argument("--json", metavar="OUT")


def live_spec(args: argparse.Namespace):
    from gpuroute.sim.bench_live import LiveBenchSpec, parse_engines, parse_fault

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


def print_table(console: Console, title: str, rows: list[dict], columns) -> None:
    table = Table(title=title)
    for _, header, _ in columns:
        table.add_column(header, justify="left" if header == "target" else "right")
    for row in rows:
        table.add_row(*(fmt.format(row[key]) for key, _, fmt in columns))
    console.print(table)


def print_fleet(console: Console, r: dict) -> None:
    table = Table(title=f"fleet membership: {r['hosts']} agents, one router, Consul dev agent")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("load staleness p50 / p99 / max (s)",
         f"{r['staleness_p50_s']:.3f} / {r['staleness_p99_s']:.3f} / {r['staleness_max_s']:.3f}"),
        ("staleness samples", f"{r['staleness_samples']:,}"),
        ("Consul Raft writes (steady)", f"{r['raft_writes']} in {r['steady_seconds']:.0f} s"),
        ("Consul Raft writes / s", f"{r['raft_writes_per_s']:.3f}"),
        ("requests ok / failed", f"{r['requests_ok']:,} / {r['requests_failed']:,}"),
    ]  # fmt: skip
    if o := r.get("outage"):
        rows += [
            (f"Consul outage {o['seconds']:.0f} s: served / failed",
             f"{o['served_during']:,} / {o['failed']:,}"),
            ("router caught up after restart (s)", f"{o['router_recovered_s']:.2f}"),
            ("all agents registered again (s)", f"{o['agents_registered_s']:.2f}"),
        ]  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console.print(table)


def run_bench(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json == "-", width=None if sys.stdout.isatty() else 140)
    try:
        if args.bench == "live":
            from gpuroute.sim.bench_live import dump, run_live_bench

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
            for target in report["targets"]:
                if "gpu_util_cv" in target:
                    console.print(
                        f"{target['target']}: GPU utilisation (work, as in the simulator) mean "
                        f"{target['gpu_util_mean']}, CV {target['gpu_util_cv']}; busy share CV "
                        f"{target['gpu_busy_cv']}"
                    )
                for fault in target.get("faults", []):
                    console.print(f"{target['target']} fault: {fault}")
                if "redis_killed_at_s" in target:
                    console.print(
                        f"Redis killed at {target['redis_killed_at_s']} s, restarted at "
                        f"{target['redis_restarted_at_s']} s; failed requests: {target['failed']}"
                    )
            if args.plot:
                from gpuroute.sim.bench_plot import plot_live

                plot_live(report, args.plot)
        elif args.bench == "replicas":
            from gpuroute.sim.bench_live import LiveBenchSpec, dump, parse_engines
            from gpuroute.sim.bench_replicas import run_replicas_bench

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
            print_table(
                console, f"{args.replicas} router replicas", report["targets"], LIVE_COLUMNS
            )
            if "p99_independent_over_shared" in report:
                cvs = ", ".join(f"{t['target']}: {t['gpu_busy_cv']}" for t in report["targets"])
                console.print(
                    f"E2E p99 independent / shared = {report['p99_independent_over_shared']}; "
                    f"GPU busy CV {cvs}"
                )
        elif args.bench == "tenants":
            from gpuroute.sim.bench_live import dump, parse_engines
            from gpuroute.sim.bench_tenants import print_tenants, run_tenants_bench, tenants_spec

            spec = tenants_spec(args, parse_engines(args.engines))
            report = run_tenants_bench(spec, lambda run: console.print(f"[bold]{run}[/]"))
            print_tenants(console, report)
        elif args.bench == "global":
            from gpuroute.sim.bench_global import run_global_bench
            from gpuroute.sim.bench_live import dump

            if args.regions < 2 or args.decisions < 100:
                raise BenchError("need --regions >= 2 and --decisions >= 100")
            report = run_global_bench(args.regions, args.decisions)
            print_table(
                console,
                f"global routing decision, {report['regions']} regions",
                report["rows"],
                GLOBAL_COLUMNS,
            )
        elif args.bench == "fleet":
            from gpuroute.sim.bench_fleet import FleetBenchSpec, run_fleet_bench
            from gpuroute.sim.bench_live import dump

            if args.hosts < 1 or args.duration <= 0 or args.outage < 0 or args.workers < 1:
                raise BenchError("need --hosts >= 1, --duration > 0, --outage >= 0, --workers >= 1")
            spec = FleetBenchSpec(args.hosts, args.duration, args.outage, args.workers)
            console.print(f"[bold]fleet[/]: {spec.hosts} simulated hosts, Consul dev agent")
            report = run_fleet_bench(spec)
            print_fleet(console, report)
        else:
            from gpuroute.sim.bench_live import dump
            from gpuroute.sim.bench_overhead import OVERHEAD_COLUMNS, run_overhead

            report = run_overhead(args.duration, console, args.rounds)
            print_table(
                console,
                "proxy overhead (tiny non-streamed requests)",
                report["rows"],
                OVERHEAD_COLUMNS,
            )
        if args.json:
            dump(report, args.json)
    except BenchError as exc:
        print(f"gpuroute bench: error: {exc}", file=sys.stderr)
        return 2
    return 0
