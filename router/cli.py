"""`gpuroute router --config FILE`."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    router = sub.add_parser("router", help="run the regional router")
    router.add_argument("--config", required=True, metavar="FILE", help="router TOML")
    router.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.router.server import run_router

    return run_router(args.config)
