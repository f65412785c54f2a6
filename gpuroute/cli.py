"""`gpuroute` command line: composes the subcommands each package registers; no logic here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpuroute import __version__
from gpuroute.config import ConfigError

# Each module has `register(subparsers)`; its parsers set `run`, a function of the
# parsed arguments returning the exit status.
COMMAND_MODULES = (
    "gpuroute.router.cli",
    "gpuroute.router.explain_cli",
    "gpuroute.global_.cli",
    "gpuroute.agent.cli",
    "gpuroute.sim.cli",
    "gpuroute.bench.cli",
    "gpuroute.demo.cli",
    "gpuroute.testbed.cli",
    "gpuroute.fleet_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuroute", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpuroute {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"gpuroute: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
