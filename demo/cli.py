"""`gpuroute demo [--global | --autoscale]`."""

from __future__ import annotations

import argparse

from gpuroute import log_flags


def register(sub) -> None:
    demo = sub.add_parser(
        "demo", help="one-machine fleet: simulated hosts, agents, Consul (if built), a router"
    )
    demo.add_argument(
        "--seconds", type=float, default=None,
        help="seconds of traffic (with --autoscale: of the burst at least, default 12)",
    )  # fmt: skip
    demo.add_argument(
        "--global", dest="global_", action="store_true",
        help="three regions behind the global tier: residency, an outage, recovery",
    )  # fmt: skip
    demo.add_argument(
        "--secure", action="store_true",
        help="with --global: TLS and mutual TLS between tiers, API keys, signed residency",
    )  # fmt: skip
    demo.add_argument(
        "--autoscale", action="store_true",
        help="a burst brings hosts in, a quiet spell drains them (`gpuroute scale --local`)",
    )  # fmt: skip
    demo.add_argument(
        "--port", type=int, default=None, metavar="N",
        help="the port clients use (the router's, with --global the global tier's); "
        "default: a free one",
    )  # fmt: skip
    log_flags.add_arguments(demo)
    demo.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.logs import configure_from

    configure_from(args)
    if args.autoscale:
        from gpuroute.demo.autoscale import run_autoscale_demo

        return run_autoscale_demo(args.seconds or 12.0)
    if args.global_:
        from gpuroute.demo.regions import run_global_demo

        return run_global_demo(args.seconds or 5.0, secure=args.secure, port=args.port)
    from gpuroute.demo.fleet import run_demo

    return run_demo(args.seconds or 16.0, port=args.port)
