"""`gpuroute bench live --scenario FILE`'s arguments, checked, and its tables (the run
itself is bench/live_fleet.py)."""

from __future__ import annotations

import argparse
import sys

from gpuroute.bench.commands import policy_names, replay_steps
from gpuroute.bench.live import dump
from gpuroute.bench.live_fleet import FleetBenchSpec, run_fleet_bench
from gpuroute.bench.tables import LIVE_COLUMNS, print_live_notes, print_table
from gpuroute.bench.targets import BASELINES, EXTRA_BASELINES, BenchError
from gpuroute.testbed.processes import StartError
from rich.console import Console

from gpuroute.config import ConfigError
from gpuroute.console.progress import progress_bar

# what a scenario brings itself (fleet, workload, SLO), and what only --engines runs have
NOT_WITH_SCENARIO = {
    "engines": "--engines (the scenario's [[gpus]] are the fleet)",
    "trace": "--trace (the scenario's workload is replayed)",
    "kill": "--kill",
    "slow": "--slow",
    "redis_outage": "--redis-outage",
    "router_python": "--router-python",
    "sim": "--sim (run `gpuroute sim` on the scenario)",
}
FLEET_COLUMNS = (*LIVE_COLUMNS, ("slo_attainment", "SLO met", "{:.3f}"))
MODEL_COLUMNS = (
    ("target", "target", "{}"),
    ("model", "model", "{}"),
    ("requests", "requests", "{:,}"),
    ("failed", "fail", "{:,}"),
    ("slo_attainment", "SLO met", "{:.3f}"),
    ("ttft_p50_s", "TTFT p50", "{:.3f}"),
    ("served_by_fallback", "by fallback", "{:,}"),
)


def fleet_spec(args: argparse.Namespace) -> FleetBenchSpec:
    """The spec from `bench live --scenario` arguments; BenchError for what does not apply."""
    given = [flag for key, flag in NOT_WITH_SCENARIO.items() if getattr(args, key, None)]
    if args.replicas != 1:
        given.append("--replicas")
    if given:
        raise BenchError(f"--scenario: not with {', '.join(given)}")
    names = "" if args.baselines == "none" else args.baselines or ",".join(BASELINES)
    baselines = [b for b in names.split(",") if b]
    for name in baselines:
        if name not in BASELINES + EXTRA_BASELINES or name == "haproxy-weighted":
            known = ", ".join(b for b in BASELINES + EXTRA_BASELINES if b != "haproxy-weighted")
            raise BenchError(f"--baselines: {name!r} cannot run a scenario; known: {known}")
    if not 0 < args.target_utilization <= 2 or args.duration <= 0 or args.time_scale <= 0:
        raise BenchError("need 0 < --target-utilization <= 2, --duration > 0, --time-scale > 0")
    return FleetBenchSpec(
        scenario=args.scenario, policies=policy_names(args.policy), baselines=baselines,
        target_utilization=args.target_utilization, duration_s=args.duration,
        time_scale=args.time_scale, stream=not args.no_stream, pin=args.pin,
    )  # fmt: skip


def run_scenario_bench(args: argparse.Namespace) -> int:
    """Run it, print its tables, write its JSON; 2 for a bench that cannot run."""
    console = Console(stderr=args.json == "-", width=None if sys.stdout.isatty() else 140)
    try:
        spec = fleet_spec(args)
        with progress_bar(quiet=args.quiet) as progress:
            report = run_fleet_bench(spec, replay_steps(console, progress, args.quiet))
    except (StartError, ConfigError) as exc:
        print(f"gpuroute bench: error: {exc}", file=sys.stderr)
        return 2
    print_fleet_report(console, report)
    if args.plot:
        from gpuroute.bench.plot import plot_live

        plot_live(report, args.plot)
    if args.json:
        dump(report, args.json)
    return 0


def print_fleet_report(console: Console, report: dict) -> None:
    kinds = ", ".join(f"{report['engines'].count(k)}×{k}" for k in dict.fromkeys(report["engines"]))
    title = (
        f"{report['scenario']}: {report['requests']:,} requests at {report['rate_rps']} req/s "
        f"({report['target_utilization']:g} of {report['capacity_rps']} at GPU speed), "
        f"{kinds}, time scale {report['time_scale']:g}"
    )
    print_table(console, title, report["targets"], FLEET_COLUMNS)
    rows = [
        {"target": t["target"], "model": model, **stats}
        for t in report["targets"]
        for model, stats in t.get("by_model", {}).items()
    ]
    if len({row["model"] for row in rows}) > 1:
        print_table(console, "per model (requested)", rows, MODEL_COLUMNS)
    print_live_notes(console, report["targets"])
    for note in report["notes"]:
        console.print(note)
