"""`--log-level` and `--log-format`, kept apart from the logging setup (gpuroute/logs.py) so
that building the command line loads no formatter: every process builds the whole parser."""

from __future__ import annotations

import argparse
import os

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("auto", "json", "text")
# read as the flags' defaults, and exported by the commands so the processes they start
# (router workers, the demo's tiers) log alike without each spawn passing the flags on
LEVEL_ENV, FORMAT_ENV = "GPUROUTE_LOG_LEVEL", "GPUROUTE_LOG_FORMAT"


def env_setting(name: str, allowed: tuple[str, ...], default: str) -> str:
    value = os.environ.get(name, "").strip().lower()
    return value if value in allowed else default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--log-level` and `--log-format`, on every long-running command."""
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default=env_setting(LEVEL_ENV, LEVELS, "info"),
        help=f"least severe record written (default info, or ${LEVEL_ENV})",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=env_setting(FORMAT_ENV, FORMATS, "auto"),
        help="json: one object a line; text: for people; auto (default): text on a "
        f"terminal, JSON otherwise (or ${FORMAT_ENV})",
    )
