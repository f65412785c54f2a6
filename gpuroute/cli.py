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
    except ConfigError as exc:
        print(f"gpuroute: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
