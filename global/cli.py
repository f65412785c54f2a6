"""`gpuroute global --config FILE`."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    glob = sub.add_parser("global", help="run the global tier (one endpoint for all regions)")
    glob.add_argument("--config", required=True, metavar="FILE", help="global TOML")
    glob.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.global_.server import run_global

    return run_global(args.config)
