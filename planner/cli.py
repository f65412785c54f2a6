"""`gpuroute plan` arguments. Imports nothing heavy (every gpuroute process builds the whole
parser at start-up): the planner and the simulator load only when the command runs."""

from __future__ import annotations

import argparse

from gpuroute.sim.cli import scenario_and_target

from gpuroute.console.progress import add_progress


def register(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="the cheapest fleet of given GPU types that meets the SLO at a peak (simulated)",
    )
    scenario_and_target(plan)
    plan.add_argument(
        "--gpu",
        action="append",
        metavar="TYPE[:tpN]",
        help="a GPU type to plan with, built-in or the scenario's [[gpu_types]], priced "
        "(repeatable; e.g. --gpu H100 --gpu L4 --gpu H200:tp4; default: the types of the "
        "scenario's [[gpus]])",
    )
    plan.add_argument(
        "--peak-rps",
        type=float,
        metavar="R",
        help="the planned peak in req/s (default: the scenario's own rate)",
    )
    plan.add_argument(
        "--budget", type=float, metavar="USD", help="$/hour the fleet may cost (exit 3 over it)"
    )
    plan.add_argument(
        "--max-backends", type=int, default=64, metavar="N", help="per model pool (default 64)"
    )
    plan.add_argument(
        "--max-runs",
        type=int,
        default=40,
        metavar="N",
        help="simulator runs per pool's search for a mix (default 40)",
    )
    plan.add_argument("--json", metavar="OUT", help="write the plan as JSON to OUT ('-' = stdout)")
    plan.add_argument("--plot", metavar="PNG", help="plot the mixes tried: SLO met against cost")
    add_progress(plan, quiet="no progress and no table")
    plan.add_argument(
        "--write-fleet",
        metavar="FILE",
        help="write the recommended fleet as a fleet file (pools rounded up to whole hosts "
        "of their AWS instance type), and run it as written at the peak",
    )
    plan.add_argument(
        "--aws-region",
        metavar="NAME",
        help="with --write-fleet: the region's deploy.aws_region (e.g. us-east-1)",
    )
    plan.set_defaults(run=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    from gpuroute.planner.plan import PlanLimits
    from gpuroute.planner.report import run_plan

    if args.max_backends < 1 or args.max_runs < 1:
        from gpuroute.config import ConfigError

        raise ConfigError("--max-backends and --max-runs must be at least 1")
    limits = PlanLimits(args.attainment, args.max_backends, args.max_runs)
    return run_plan(
        args.scenario,
        args.gpu,
        peak_rps=args.peak_rps,
        budget=args.budget,
        limits=limits,
        json_out=args.json,
        plot_out=args.plot,
        quiet=args.quiet,
        progress=args.progress,
        write_fleet=args.write_fleet,
        aws_region=args.aws_region,
    )
