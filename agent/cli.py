"""`gpuroute agent [run|drain] --config FILE`."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    agent = sub.add_parser("agent", help="run the node agent, or tell a running one to drain")
    agent.add_argument("action", nargs="?", choices=["run", "drain"], default="run")
    agent.add_argument("--config", required=True, metavar="FILE", help="agent TOML")
    agent.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.agent.server import request_drain, run_agent

    return run_agent(args.config) if args.action == "run" else request_drain(args.config)
