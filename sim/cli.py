"""`gpuroute sim` arguments. Imports nothing heavy: every gpuroute process (router, agent,
fake engine) builds the whole parser at start-up; the simulator loads only when it runs."""

from __future__ import annotations

import argparse

from gpuroute.console.progress import add_progress


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
    add_progress(sim, quiet="no progress and no table")
    fleet_arguments(sim)
    sim.set_defaults(run=_run)
    register_capacity(sub)
    register_scaling(sub)


def scenario_and_target(parser: argparse.ArgumentParser) -> None:
    """`--scenario` and `--attainment`, as `capacity` and `plan` (gpuroute/planner) read them."""
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


def fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """`--fleet FILE` and the traffic flags used when no `--scenario` gives the traffic."""
    parser.add_argument(
        "--fleet",
        metavar="FILE",
        help="a fleet file: its pools replace the scenario's [[gpus]] (without --scenario, "
        "traffic from the flags below, each model's share of requests its share of GPUs)",
    )
    group = parser.add_argument_group(
        "traffic for --fleet without --scenario (--rate-rps also sets a scenario's rate)"
    )
    group.add_argument("--profile", default="chat", metavar="NAME", help="default: chat")
    group.add_argument(
        "--rate-rps", type=float, metavar="R", help="default: 80%% of the fleet's capacity"
    )
    group.add_argument("--requests", type=int, default=2000, metavar="N", help="default 2000")
    group.add_argument("--seed", type=int, default=0, metavar="N", help="default 0")


def traffic_of(args: argparse.Namespace):
    """The traffic flags, checked; None where a scenario gives the traffic."""
    from gpuroute.sim.run import Traffic

    from gpuroute.config import ConfigError

    if args.requests < 1 or (args.rate_rps is not None and args.rate_rps <= 0):
        raise ConfigError("--requests and --rate-rps must be positive")
    if args.fleet is None or args.scenario is not None:  # a scenario's traffic, maybe faster
        return None if args.rate_rps is None else Traffic(rate_rps=args.rate_rps)
    return Traffic(args.profile, args.requests, args.rate_rps, args.seed)


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
    add_progress(cap, quiet="no progress and no table")
    fleet_arguments(cap)
    cap.set_defaults(run=_run_capacity)


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


def _run(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import run_sim

    return run_sim(
        args.scenario,
        args.policy,
        args.json,
        quiet=args.quiet,
        fleet=args.fleet,
        traffic=traffic_of(args),
        progress=args.progress,
    )


def _run_capacity(args: argparse.Namespace) -> int:
    from gpuroute.sim.run import run_capacity

    return run_capacity(
        args.scenario,
        args.policy,
        args.attainment,
        args.json,
        args.plot,
        quiet=args.quiet,
        fleet=args.fleet,
        traffic=traffic_of(args),
        progress=args.progress,
    )
