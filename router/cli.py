"""`gpuroute router --config FILE [--workers N|auto]`."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    router = sub.add_parser("router", help="run the regional router")
    router.add_argument("--config", required=True, metavar="FILE", help="router TOML")
    router.add_argument(
        "--workers",
        metavar="N",
        help='processes serving the port together, or "auto" (one per usable core); '
        "overrides workers.count",
    )
    # how the parent of several workers starts each one (not for people)
    router.add_argument("--worker", help=argparse.SUPPRESS)
    router.add_argument("--run-dir", help=argparse.SUPPRESS)
    router.add_argument("--port", type=int, help=argparse.SUPPRESS)
    router.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.router.process import run_router

    workers = args.workers
    if workers is not None and workers != "auto":
        try:
            workers = int(workers)
        except ValueError:
            workers = 0
        if not 1 <= workers <= 256:
            message = 'gpuroute router: error: --workers: expected 1 to 256, or "auto"'
            print(message, file=sys.stderr)
            return 2
    worker = None
    if args.worker is not None:
        index, count = (int(n) for n in args.worker.split("/"))
        worker = (index, count, args.run_dir, args.port)
    return run_router(args.config, workers, worker)
