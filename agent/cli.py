"""`gpuroute agent [run|drain|undrain|standby|activate] --config FILE`."""

from __future__ import annotations

import argparse

from gpuroute import log_flags


def register(sub) -> None:
    agent = sub.add_parser(
        "agent", help="run the node agent; drain, undrain, stand by or activate a running one"
    )
    agent.add_argument(
        "action",
        nargs="?",
        choices=["run", "drain", "undrain", "standby", "activate"],
        default="run",
    )
    agent.add_argument("--config", required=True, metavar="FILE", help="agent TOML")
    log_flags.add_arguments(agent)
    agent.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.agent.admin import request_admin
    from gpuroute.agent.server import run_agent

    from gpuroute.logs import configure_from

    configure_from(args)
    if args.action == "run":
        return run_agent(args.config)
    return request_admin(args.config, args.action)
