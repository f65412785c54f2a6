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
    register_plan(sub)
    register_scaling(sub)


def scenario_and_target(parser: argparse.ArgumentParser) -> None:
    """`--scenario` and `--attainment`, as `capacity` and `plan` read them."""
    parser.add_argument(
        "--scenario", metavar="FILE", help="scenario TOML or built-in name (default: the demo)"
    )
    parser.add_argument(
        "--attainment",
        type=float,
        default=0.9,
        metavar="FRACTION",
        help="share of requests that must meet their SLO (default 0.9)",
    )


def register_capacity(sub) -> None:
    cap = sub.add_parser(
        "capacity",
        help="SLO capacity of a fleet per policy: the highest load at which the SLO holds",
    )
    scenario_and_target(cap)
    cap.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="policy to size (repeatable; 'default' = the router's default policy; "
        "default: the scenario's [router] policies)",
    )
    cap.add_argument("--json", metavar="OUT", help="write results as JSON to OUT ('-' = stdout)")
    cap.add_argument("--plot", metavar="PNG", help="plot attainment against load (matplotlib)")
    cap.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    cap.set_defaults(run=_run_capacity)


def register_plan(sub) -> None:
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
    plan.add_argument("--quiet", action="store_true", help="no table")
    plan.set_defaults(run=_run_plan)


def register_scaling(sub) -> None:
    scaling = sub.add_parser(
        "scaling",
        help="a scenario's scaling pools against a fixed fleet: GPU-hours, SLO, flash crowds",
    )
    scaling.add_argument(
        "--scenario", metavar="FILE", required=True, help="scenario TOML with [autoscale]"
    )
    scaling.add_argument(
        "--fixed",
        type=int,
        action="append",
        required=True,
        metavar="N",
        help="engines of a fixed fleet to compare with (repeatable; GPU-hours are compared "
        "with the first: the fleet sized for the peak)",
    )
    scaling.add_argument(
        "--policy", default="default", metavar="NAME", help="routing policy (default: default)"
    )
    scaling.add_argument("--json", metavar="OUT", help="write the rows as JSON ('-' = stdout)")
    scaling.set_defaults(run=_run_scaling)


def _run_scaling(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import check_policies, resolve_scenario
    from gpuroute.sim.scaling_report import run_scaling

    check_policies([args.policy])
    return run_scaling(resolve_scenario(args.scenario), args.fixed, args.policy, args.json)


def _run_plan(args: argparse.Namespace) -> int:
    from gpuroute.sim.plan import PlanLimits
    from gpuroute.sim.plan_report import run_plan

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
    )


def _run(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import run_sim

    return run_sim(args.scenario, args.policy, args.json, quiet=args.quiet)


def _run_capacity(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import run_capacity

    return run_capacity(
        args.scenario, args.policy, args.attainment, args.json, args.plot, quiet=args.quiet
    )
