"""`gpuroute scale`: every interval, the desired pool sizes of one or more routers
(`/admin/autoscale`, the most any router asks per pool) handed to an executor when they
change: a command (JSON on stdin), a webhook (JSON POSTed), or, for the demo and tests,
hosts on this machine (`--local`). Exit status: 0 stopped by SIGINT/SIGTERM (or `--once`
done), 1 `--once` found no router answering or the executor failed (or the local hosts
would not start), 2 bad input."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from gpuroute import log_flags
from gpuroute.config import ConfigError, is_loopback

TOKEN_ENV = "GPUROUTE_ADMIN_TOKEN"  # as `gpuroute admin` (router/admin/client.py)


def register(sub) -> None:
    scale = sub.add_parser(
        "scale", help="hand the routers' desired pool sizes to a command, webhook or local hosts"
    )
    scale.add_argument(
        "--router",
        action="append",
        required=True,
        metavar="URL",
        help="a router's admin listener (repeat for each router of the region)",
    )
    scale.add_argument(
        "--admin-token-file",
        metavar="FILE",
        help=f"the routers' admin token, one line (default: ${TOKEN_ENV})",
    )
    _executor_arguments(scale)
    scale.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="seconds between rounds (default: the routers' interval_s)",
    )
    scale.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="the command's or webhook's deadline (default 30)",
    )
    scale.add_argument(
        "--stale-after",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long a silent router's last answer stands (default 300)",
    )
    scale.add_argument("--once", action="store_true", help="one round, then exit")
    _local_arguments(scale.add_argument_group("--local (demo and tests)"))
    log_flags.add_arguments(scale)
    scale.set_defaults(run=_run)


def _executor_arguments(parser: argparse.ArgumentParser) -> None:
    executor = parser.add_mutually_exclusive_group(required=True)
    executor.add_argument(
        "--command",
        metavar="CMD",
        help="run CMD (split like a shell, run without one) with the sizes "
        "as JSON on stdin; exit 0 means done",
    )
    executor.add_argument("--webhook", metavar="URL", help="POST the sizes as JSON to URL")
    executor.add_argument(
        "--local",
        action="store_true",
        help="run hosts on this machine (fake engines and their agents)",
    )
    parser.add_argument(
        "--webhook-token-file", metavar="FILE", help="a bearer token for --webhook, one line"
    )
    parser.add_argument(
        "--allow-http",
        action="store_true",
        help="send to plain http:// URLs off loopback (webhook, routers)",
    )


def _local_arguments(local: argparse._ArgumentGroup) -> None:
    local.add_argument("--consul", metavar="URL", help="the Consul agent the hosts register with")
    local.add_argument(
        "--model",
        action="append",
        metavar="MODEL",
        help="a pool to run hosts for (repeatable; default llama-3.1-8b)",
    )
    local.add_argument("--gpu", default="L4", help="the hosts' GPU type (default L4)")
    local.add_argument(
        "--initial-hosts",
        type=int,
        default=1,
        metavar="N",
        help="active hosts per pool at start (default 1)",
    )
    local.add_argument(
        "--boot-delay",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a new host's boot and model load, simulated (default 5)",
    )
    local.add_argument(
        "--max-hosts",
        type=int,
        default=8,
        metavar="N",
        help="hosts running or booting, at most (default 8)",
    )
    local.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the fake engines run this many times slower (default 1)",
    )
    local.add_argument(
        "--workdir", metavar="DIR", help="configs and logs (default: a new temp dir)"
    )


def _run(args: argparse.Namespace) -> int:
    from gpuroute.logs import configure_from

    configure_from(args)
    try:
        routers, executor = _routers(args), _executor(args)
    except ConfigError as exc:
        print(f"gpuroute scale: error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(args, routers, executor))


def _read_token(path: str | None, flag: str) -> str | None:
    from gpuroute.secrets import read_secret_file

    return None if path is None else read_secret_file(path, flag)


def _routers(args: argparse.Namespace) -> list:
    from gpuroute.router.scaling.scaler import RouterAdmin

    token = _read_token(args.admin_token_file, "--admin-token-file") or os.environ.get(TOKEN_ENV)
    routers = []
    for url in args.router:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--router: {url!r} is not an http(s) URL")
        if (
            parts.scheme == "http"
            and token
            and not (args.allow_http or is_loopback(parts.hostname))
        ):
            raise ConfigError(
                f"--router: {url} is plain http off loopback and would carry the "
                "admin token in clear; use https, or allow it with --allow-http"
            )
        routers.append(RouterAdmin(url.rstrip("/"), token or None))
    for flag in ("interval", "timeout", "stale_after"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be > 0, got {value}")
    return routers


def _executor(args: argparse.Namespace):
    if args.command is not None:
        from gpuroute.router.scaling.executors import CommandExecutor

        try:
            return CommandExecutor(shlex.split(args.command), args.timeout)
        except ValueError as exc:
            raise ConfigError(f"--command: {exc}") from None
    if args.webhook is not None:
        from gpuroute.router.scaling.executors import WebhookExecutor, webhook_refusal

        if (why := webhook_refusal(args.webhook, args.allow_http)) is not None:
            raise ConfigError(f"--webhook: {why}")
        token = _read_token(args.webhook_token_file, "--webhook-token-file")
        return WebhookExecutor(args.webhook, token, args.timeout)
    return _local_executor(args)


def _local_executor(args: argparse.Namespace):
    from gpuroute.testbed.local_scaler import MODEL, LocalFleet, LocalFleetSettings

    if args.consul is None:
        raise ConfigError("--local needs --consul URL (the Consul agent hosts register with)")
    if args.initial_hosts < 0 or args.max_hosts < 1 or args.boot_delay < 0:
        raise ConfigError("--local: need --initial-hosts >= 0, --max-hosts >= 1, --boot-delay >= 0")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpuroute-scale-"))
    settings = LocalFleetSettings(
        consul=args.consul,
        workdir=workdir,
        models=tuple(args.model or [MODEL]),
        gpu=args.gpu,
        initial_hosts=args.initial_hosts,
        boot_delay_s=args.boot_delay,
        max_hosts=args.max_hosts,
        time_scale=args.time_scale,
    )
    return LocalFleet(settings)


async def _serve(args: argparse.Namespace, routers: list, executor) -> int:
    from gpuroute.router.scaling.scaler import Scaler

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    scaler = Scaler(routers, executor, interval_s=args.interval, stale_after_s=args.stale_after)
    try:
        if args.local:
            await executor.start()
        ok = await scaler.run(stop, rounds=1 if args.once else None)
    except RuntimeError as exc:  # StartError: the local hosts would not start
        print(f"gpuroute scale: error: {exc}", file=sys.stderr)
        return 1
    finally:
        await executor.close()
    return 0 if ok or not args.once else 1
