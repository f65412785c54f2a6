"""`gpuroute` command line. Subcommands build their objects and hand over; no logic here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpuroute import __version__
from gpuroute.config import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuroute", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpuroute {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser("sim", help="simulate a fleet under a workload and compare policies")
    sim.add_argument(
        "--scenario",
        metavar="FILE",
        help="scenario TOML (default: the built-in demo, a synthetic mixed fleet)",
    )
    sim.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="policy to run (repeatable; default: the scenario's [router] policies)",
    )
    sim.add_argument("--json", metavar="OUT", help="write results as JSON to OUT ('-' = stdout)")
    sim.add_argument("--quiet", action="store_true", help="no progress bar and no table")

    check = sub.add_parser("check-config", help="validate a regions file")
    check.add_argument("file", metavar="FILE")

    tfvars = sub.add_parser(
        "tfvars", help="Terraform variables (JSON) for deploy/terraform from a regions file"
    )
    tfvars.add_argument("file", metavar="FILE")

    fake = sub.add_parser(
        "fake-engine", help="serve a simulated GPU engine with vLLM's OpenAI API and metrics"
    )
    fake.add_argument("--gpu", default="H100", help="GPU type (H100, A100, L4, T4, V100)")
    fake.add_argument("--port", type=int, default=8000)
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--model", default="llama-3.1-8b", help="engine model shape")
    fake.add_argument("--served-name", help="model name in the API (default: --model)")
    fake.add_argument(
        "--time-scale", type=float, default=1.0, help="run this many times slower than the GPU"
    )
    fake.add_argument("--default-output-tokens", type=int, default=128)
    fake.add_argument("--stream-interval-ms", type=float, default=20.0)
    fake.add_argument("--seed", type=int, default=0)

    from gpuroute.sim.bench_cli import add_bench_parser

    add_bench_parser(sub)

    router = sub.add_parser("router", help="run the regional router")
    router.add_argument("--config", required=True, metavar="FILE", help="router TOML")

    demo = sub.add_parser(
        "demo", help="one-machine fleet: simulated hosts, agents, Consul (if built), a router"
    )
    demo.add_argument("--seconds", type=float, default=None, help="seconds of traffic")
    demo.add_argument(
        "--global", dest="global_", action="store_true",
        help="three regions behind the global tier: residency, an outage, recovery",
    )  # fmt: skip

    glob = sub.add_parser("global", help="run the global tier (one endpoint for all regions)")
    glob.add_argument("--config", required=True, metavar="FILE", help="global TOML")

    agent = sub.add_parser("agent", help="run the node agent, or tell a running one to drain")
    agent.add_argument("action", nargs="?", choices=["run", "drain"], default="run")
    agent.add_argument("--config", required=True, metavar="FILE", help="agent TOML")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "sim":
            from gpuroute.sim.cli import run_sim

            return run_sim(args.scenario, args.policy, args.json, quiet=args.quiet)
        if args.command == "check-config":
            from gpuroute.regions import load_fleet

            fleet = load_fleet(args.file)
            gpus = sum(p.count for r in fleet.regions for p in r.gpu_pools)
            print(f"{args.file}: ok ({len(fleet.regions)} regions, {gpus} GPUs)")
            return 0
        if args.command == "tfvars":
            from gpuroute.tfvars import render_tfvars

            sys.stdout.write(render_tfvars(args.file))
            return 0
        if args.command == "fake-engine":
            from gpuroute.sim.fake_engine import FakeEngineConfig, run_fake_engine

            try:
                config = FakeEngineConfig(
                    gpu=args.gpu,
                    model=args.model,
                    served_name=args.served_name,
                    host=args.host,
                    port=args.port,
                    time_scale=args.time_scale,
                    default_output_tokens=args.default_output_tokens,
                    stream_interval_s=args.stream_interval_ms / 1000,
                    seed=args.seed,
                )
            except ValueError as exc:
                print(f"gpuroute fake-engine: error: {exc}", file=sys.stderr)
                return 2
            run_fake_engine(config)
            return 0
        if args.command == "bench":
            from gpuroute.sim.bench_cli import run_bench

            return run_bench(args)
        if args.command == "router":
            from gpuroute.router.server import run_router

            return run_router(args.config)
        if args.command == "global":
            from gpuroute.global_.server import run_global

            return run_global(args.config)
        if args.command == "demo":
            if args.global_:
                from gpuroute.sim.demo_global import run_global_demo

                return run_global_demo(args.seconds or 5.0)
            from gpuroute.sim.demo_fleet import run_demo

            return run_demo(args.seconds or 16.0)
        if args.command == "agent":
            from gpuroute.agent.server import request_drain, run_agent

            return run_agent(args.config) if args.action == "run" else request_drain(args.config)
    except ConfigError as exc:
        print(f"gpuroute: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
