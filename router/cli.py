"""`gpuroute router --config FILE [--workers N|auto]`."""

from __future__ import annotations

import argparse

from gpuroute import log_flags


def worker_count(text: str) -> int | str:
    """`--workers`, checked as `workers.count` is (one rule for the flag and the key)."""
    from gpuroute.router.config.router import WorkersConfig
    from pydantic import ValidationError

    count: int | str = text
    if text != "auto":
        try:
            count = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError('expected 1 to 256, or "auto"') from None
    try:
        return WorkersConfig(count=count).count
    except ValidationError as exc:
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise argparse.ArgumentTypeError(message) from None


def register(sub) -> None:
    router = sub.add_parser("router", help="run the regional router")
    router.add_argument("--config", required=True, metavar="FILE", help="router TOML")
    router.add_argument(
        "--workers",
        metavar="N",
        type=worker_count,
        help='processes serving the port together, or "auto" (one per usable core); '
        "overrides workers.count",
    )
    # how the parent of several workers starts each one (router/workers/parent.py; not for people)
    router.add_argument("--worker", help=argparse.SUPPRESS)
    router.add_argument("--run-dir", help=argparse.SUPPRESS)
    router.add_argument("--port", type=int, help=argparse.SUPPRESS)
    log_flags.add_arguments(router)
    router.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.router.process import run_router
    from gpuroute.router.workers.parent import WorkerRole

    from gpuroute.logs import configure_from

    configure_from(args)
    role = None
    if args.worker is not None:
        role = WorkerRole.from_arguments(args.worker, args.run_dir, args.port)
    return run_router(args.config, args.workers, role)
