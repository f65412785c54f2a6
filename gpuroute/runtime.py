"""Process start-up shared by the long-running commands (router, agent, simulated hosts)."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import Callable, Collection, Coroutine
from typing import Any

from gpuroute import logs
from gpuroute.config import ConfigError


def configure_logging(level: int = logging.INFO) -> None:
    """gpuroute/logs.py's setup, unless the command's flags made it already."""
    logs.ensure_configured(logging.getLevelName(level).lower())


def run(main: Coroutine[Any, Any, Any], *, fast_loop: bool = True) -> Any:
    """Run on uvloop when it is installed (it is a dependency) and `fast_loop`, else on
    asyncio's own loop. Processes whose work is mostly gRPC serving (agents) take asyncio's
    loop: it is the one grpc.aio is built and tested on, and they need no speed."""
    if fast_loop:
        try:
            import uvloop
        except ImportError:  # pragma: no cover
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def freeze_startup_heap() -> None:
    """Move what start-up built (modules, config, tables, clients) out of the collector's
    reach. A full collection otherwise walks all of it: a 20 ms stall every few seconds
    under load on a 2-core VM, the whole of the router's p99 at 32 connections."""
    gc.collect()
    gc.freeze()


def run_from_config(
    name: str,
    path: str,
    load: Callable[[str], Any],
    start: Callable[[Any], Coroutine[Any, Any, Any]],
    *,
    fast_loop: bool = True,
) -> int:
    """`gpuroute NAME --config PATH`: load the file, build the process from it (secrets and
    certificates it names are read here), then serve. Every config problem ends the process
    before the event loop with one line naming the file and the key (exit 2); a port in use
    with one line too (exit 1), never a traceback."""
    configure_logging()
    try:
        config = load(path)
    except ConfigError as exc:  # the message names the file already
        print(f"gpuroute {name}: error: {exc}", file=sys.stderr)
        return 2
    try:
        main = start(config)
    except ConfigError as exc:
        print(f"gpuroute {name}: error: {path}: {exc}", file=sys.stderr)
        return 2
    try:
        code = run(main, fast_loop=fast_loop)
    except OSError as exc:
        print(f"gpuroute {name}: error: {exc}", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0  # a supervisor's exit status


RECANCEL_S = 0.5  # how long a stopped loop has to end before it is cancelled again


class BackgroundLoop:
    """One coroutine that runs for its owner's lifetime: started once, and on stop
    cancelled and awaited, so no task outlives the object or dies unobserved."""

    def __init__(self) -> None:
        self._task: asyncio.Task | None = None

    def start(self, coro: Coroutine[Any, Any, Any]) -> None:
        assert self._task is None, "already started"
        self._task = asyncio.create_task(coro)

    async def stop(self) -> None:
        """Cancel it and await its end, cancelling again each RECANCEL_S until it ends: a
        cancellation can be lost inside what the loop awaits (one that lands as a Redis
        call's own timeout fires can leave Python 3.11's asyncio.timeout as TimeoutError,
        which the shared-load loop takes for Redis trouble and sleeps on), and a router's
        shutdown then waited for the loop forever."""
        task, self._task = self._task, None
        if task is None:
            return
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=RECANCEL_S)
        await asyncio.gather(task, return_exceptions=True)  # its exception, retrieved


async def cancel_within(
    tasks: Collection[asyncio.Task], timeout_s: float, what: str, log: logging.Logger
) -> None:
    """Cancel `tasks` and wait for them a bounded time: a gRPC channel whose call was
    cancelled can fail to close (grpc/grpc#32005, #41875), and shutdown must not hang.
    Those still running are logged and left."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    if pending:
        log.warning("%d %s did not close in %.0f s", len(pending), what, timeout_s)
