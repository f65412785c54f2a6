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


def _run(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import run_sim

    return run_sim(args.scenario, args.policy, args.json, quiet=args.quiet)
