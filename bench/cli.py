"""`gpuroute bench KIND` arguments: one entry per benchmark. Imports nothing heavy (every
gpuroute process builds the whole parser at start-up); bench/commands.py turns the arguments
into typed specs and runs the benchmark."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuroute.console.progress import add_progress


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]


def register(sub) -> None:
    bench = sub.add_parser(
        "bench", help="benchmarks on live processes: gpuroute against HAProxy, NGINX, peer routers"
    )
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="KIND")
    for entry in BENCHES:
        parser = kinds.add_parser(entry.name, help=entry.help)
        entry.add_arguments(parser)
        parser.add_argument("--json", metavar="OUT", help="write results as JSON ('-' = stdout)")
        parser.set_defaults(run=functools.partial(_run, entry.name))


def _run(name: str, args: argparse.Namespace) -> int:
    if name == "live":
        merge_policies(args)
        if args.scenario is not None:
            from gpuroute.bench.live_fleet_cli import run_scenario_bench

            return run_scenario_bench(args)
        args.engines = args.engines or DEFAULT_ENGINES
    from gpuroute.bench.commands import run_bench

    return run_bench(name, args)


DEFAULT_ENGINES = "H100:2,A100:4,L4:4"


def merge_policies(args: argparse.Namespace) -> None:
    """`--policies A,B` is `--policy A --policy B` (after any --policy given)."""
    if args.policies:
        args.policy = (args.policy or []) + [p for p in args.policies.split(",") if p]


def _live_arguments(live: argparse.ArgumentParser) -> None:
    live.add_argument(
        "--engines", help=f"GPU:count,... of fake engines (default: {DEFAULT_ENGINES})"
    )
    live.add_argument(
        "--scenario",
        metavar="FILE",
        help="a simulator scenario (file, or name in sim/scenarios) instead of --engines and "
        "--trace: its [[gpus]] as fake engines (declared GPU types, tensor parallel, each "
        "group's model), its [[gpu_types]], [[models]] and [slo] in our router, its workload "
        "with each request's model drawn from workload.models",
    )
    live.add_argument("--trace", type=Path, help="trace file (default: built-in synthetic chat)")
    live.add_argument("--format", default="azure", help="azure, mooncake or lengths")
    live.add_argument("--target-utilization", type=float, default=0.85)
    live.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    live.add_argument("--time-scale", type=float, default=2.0, help="engines run this much slower")
    live.add_argument(
        "--policy", action="append", help="our policies to run (repeatable; default: default)"
    )
    live.add_argument("--policies", metavar="A,B", help="our policies to run, a comma list")
    live.add_argument("--router-python", type=Path, default=None, help=ROUTER_PYTHON_HELP)
    live.add_argument(
        "--baselines",
        help="comma list of haproxy, nginx, haproxy-weighted, smg-cache-aware, smg-p2c, "
        "vllm-router-cache-aware, vllm-router-p2c, or 'none' (default: haproxy,nginx)",
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
    add_progress(live, quiet="no progress")
    live.add_argument("--slo-ttft", type=float, default=5.0, help="TTFT SLO, s at GPU speed")
    live.add_argument("--slo-tpot", type=float, default=0.1, help="TPOT SLO, s at GPU speed")
    live.add_argument(
        "--pin",
        action="store_true",
        help="each proxy on CPU 1 and the engines on CPU 0 (the same core for every proxy)",
    )
    live.add_argument(
        "--sim",
        action="store_true",
        help="also simulate our policies on the same fleet, requests and time scale",
    )


def _overhead_arguments(over: argparse.ArgumentParser) -> None:
    over.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    over.add_argument("--rounds", type=int, default=3, help="visits to each target (medians)")
    over.add_argument(
        "--tls",
        action="store_true",
        help="also measure gpuroute with a TLS listener (target gpuroute-tls; needs openssl)",
    )
    over.add_argument(
        "--workers",
        type=int,
        default=0,
        help="also compare the router with 1 and this many workers (router --workers)",
    )
    over.add_argument(
        "--router-python",
        type=Path,
        default=None,
        help="also measure the router as this interpreter imports it (another checkout's "
        "venv: target gpuroute-other), for a before/after in the same run",
    )


def _stream_arguments(stream: argparse.ArgumentParser) -> None:
    stream.add_argument(
        "--targets",
        default="gpuroute,haproxy,nginx,smg-cache-aware,vllm-router-cache-aware",
        help="comma list: gpuroute, haproxy, nginx, and the peer routers (make peer-routers)",
    )
    stream.add_argument("--streams", default="1,100,1000", help="comma list of stream counts")
    stream.add_argument("--tokens", type=int, default=64, help="tokens (events) per stream")
    stream.add_argument("--token-interval-ms", type=float, default=50.0)
    stream.add_argument("--rounds", type=int, default=1, help="visits to each target (medians)")


def _replicas_arguments(reps: argparse.ArgumentParser) -> None:
    reps.add_argument("--replicas", type=int, default=4)
    reps.add_argument("--engines", default="H100:2,A100:4,L4:4")
    reps.add_argument("--duration", type=float, default=90.0)
    reps.add_argument("--time-scale", type=float, default=2.0)
    reps.add_argument("--target-utilization", type=float, default=0.85)


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


def _global_arguments(glob: argparse.ArgumentParser) -> None:
    glob.add_argument("--regions", type=int, default=20)
    glob.add_argument("--decisions", type=int, default=100_000)


ROUTER_PYTHON_HELP = (
    "also run our policies as this interpreter imports them (another checkout's venv: "
    "POLICY@other), for a before/after in the same run"
)


def _decide_arguments(decide: argparse.ArgumentParser) -> None:
    decide.add_argument("--backends", type=int, default=100)
    decide.add_argument("--decisions", type=int, default=50_000)
    decide.add_argument(
        "--policy", action="append", help="policies to time (repeatable; default: default)"
    )
    decide.add_argument("--router-python", type=Path, default=None, help=ROUTER_PYTHON_HELP)


def _fleet_arguments(fleet: argparse.ArgumentParser) -> None:
    fleet.add_argument("--hosts", type=int, default=50, help="simulated GPU hosts (agents)")
    fleet.add_argument("--duration", type=float, default=60.0, help="steady-state seconds")
    fleet.add_argument("--outage", type=float, default=30.0, help="Consul down this long (0: no)")
    fleet.add_argument("--workers", type=int, default=8, help="closed-loop clients")


def _real_arguments(real: argparse.ArgumentParser) -> None:
    real.add_argument(
        "--targets",
        default="default,round_robin,smg-cache-aware,vllm-router-cache-aware",
        help="comma list: default, round_robin (ours), smg-cache-aware, smg-p2c, "
        "vllm-router-cache-aware, vllm-router-p2c",
    )
    real.add_argument("--workloads", default="prefix,chat", help="comma list: prefix, chat")
    real.add_argument("--scale", type=int, default=1, help="multiply the request counts")
    real.add_argument("--seed", type=int, default=1)
    add_progress(real, quiet="no progress")
    real.add_argument(
        "--workers", type=int, default=1, help="our router's worker processes (on one core)"
    )


BENCHES = (
    Bench("live", "replay a trace through our router and the baselines", _live_arguments),
    Bench("overhead", "added latency and throughput of each proxy", _overhead_arguments),
    Bench("stream", "token events each proxy relays per core, and what it adds", _stream_arguments),
    Bench(
        "replicas",
        "router replicas over a Consul-discovered fleet: shared vs independent",
        _replicas_arguments,
    ),
    Bench(
        "tenants",
        "one tenant's burst against another's latency, across replicas",
        _tenants_arguments,
    ),
    Bench("global", "time one global routing decision", _global_arguments),
    Bench("decide", "time one regional routing decision in the core", _decide_arguments),
    Bench("real", "our router and the peer routers in front of two real vLLMs", _real_arguments),
    Bench(
        "fleet",
        "Consul-discovered simulated hosts: load staleness, Raft writes, outage",
        _fleet_arguments,
    ),
)
