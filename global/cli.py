"""`gpuroute global --config FILE`."""

from __future__ import annotations

import argparse

from gpuroute import log_flags


def register(sub) -> None:
    glob = sub.add_parser("global", help="run the global tier (one endpoint for all regions)")
    glob.add_argument("--config", required=True, metavar="FILE", help="global TOML")
    log_flags.add_arguments(glob)
    glob.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.global_.server import run_global

    from gpuroute.logs import configure_from

    configure_from(args)
    return run_global(args.config)
