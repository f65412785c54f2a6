"""The `gpuroute` command: each package registers its subcommands (`register(sub)`);
the top-level help groups them for a user."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from gpuroute import __version__
from gpuroute.config import ConfigError

# Each module has `register(subparsers)`; its parsers set `run`, a function of the
# parsed arguments returning the exit status.
COMMAND_MODULES = (
    "gpuroute.router.cli",
    "gpuroute.router.admin.explain_cli",
    "gpuroute.router.admin.cli",
    "gpuroute.router.admin.usage_cli",
    "gpuroute.global_.cli",
    "gpuroute.agent.cli",
    "gpuroute.sim.cli",
    "gpuroute.planner.cli",
    "gpuroute.bench.cli",
    "gpuroute.demo.cli",
    "gpuroute.testbed.cli",
    "gpuroute.commands.check_config",
    "gpuroute.commands.scale",
)


ABOUT = (
    "gpuroute routes OpenAI-compatible LLM requests across GPU inference servers, in one "
    "region or many, sending each where it is predicted to meet its latency SLO."
)
# How `gpuroute --help` groups the commands; one not listed here shows under "Other".
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Run a tier", ("router", "agent", "global")),
    ("Operate", ("explain", "admin", "usage", "scale")),
    ("Try it on one machine", ("demo", "fake-engine")),
    ("Plan and measure", ("sim", "capacity", "plan", "scaling", "bench")),
    ("Configure and deploy", ("check-config", "tfvars")),
)


class _Commands:
    """The subparsers as packages see them, remembering each command's one-line help."""

    def __init__(self, sub: argparse._SubParsersAction) -> None:
        self.sub, self.helps = sub, {}

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        self.helps[name] = kwargs.get("help") or ""
        return self.sub.add_parser(name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuroute",
        usage="gpuroute [-h] [--version] COMMAND ...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuroute {__version__}")
    # the grouped list in the description stands in for argparse's flat one
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, prog="gpuroute"
    )
    commands = _Commands(sub)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    parser.description = describe_commands(commands.helps)
    return parser


def describe_commands(helps: dict[str, str]) -> str:
    """What gpuroute is, then each command's one-line help under its group."""
    width = max(map(len, helps)) + 2
    lines = textwrap.wrap(ABOUT, 79)
    grouped = [(title, [n for n in names if n in helps]) for title, names in GROUPS]
    listed = {n for _, names in grouped for n in names}
    grouped.append(("Other", [n for n in helps if n not in listed]))
    for title, names in grouped:
        if names:
            lines += ["", f"{title}:"]
            lines += [f"  {name:<{width}}{helps[name]}" for name in names]
    lines += ["", "`gpuroute COMMAND --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"gpuroute: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
