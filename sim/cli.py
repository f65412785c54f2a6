"""`gpuroute sim` arguments. Imports nothing heavy: every gpuroute process (router, agent,
fake engine) builds the whole parser at start-up; the simulator loads only when it runs."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    sim = sub.add_parser("sim", help="simulate a fleet under a workload and compare policies")
    sim.add_argument(
        "--scenario",
        metavar="FILE",
        help="scenario TOML, or the name of one in sim/scenarios "
        "(default: the built-in demo, a synthetic mixed fleet)",
    )
    sim.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="policy to run (repeatable; default: the scenario's [router] policies)",
    )
    sim.add_argument("--json", metavar="OUT", help="write results as JSON to OUT ('-' = stdout)")
    sim.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    sim.set_defaults(run=_run)
    register_capacity(sub)


def register_capacity(sub) -> None:
    cap = sub.add_parser(
        "capacity",
        help="SLO capacity of a fleet per policy: the highest load at which the SLO holds",
    )
    cap.add_argument(
        "--scenario", metavar="FILE", help="scenario TOML or built-in name (default: the demo)"
    )
    cap.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="policy to size (repeatable; 'default' = the router's default policy; "
        "default: the scenario's [router] policies)",
    )
    cap.add_argument(
        "--attainment",
        type=float,
        default=0.9,
        metavar="FRACTION",
        help="share of requests that must meet their SLO (default 0.9)",
    )
    cap.add_argument("--json", metavar="OUT", help="write results as JSON to OUT ('-' = stdout)")
    cap.add_argument("--plot", metavar="PNG", help="plot attainment against load (matplotlib)")
    cap.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    cap.set_defaults(run=_run_capacity)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import run_sim

    return run_sim(args.scenario, args.policy, args.json, quiet=args.quiet)


def _run_capacity(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import run_capacity

    return run_capacity(
        args.scenario, args.policy, args.attainment, args.json, args.plot, quiet=args.quiet
    )
