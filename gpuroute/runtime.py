"""Process start-up shared by the long-running commands (router, agent, simulated hosts)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """Run on uvloop when it is installed (it is a dependency), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(main)
    return uvloop.run(main)
