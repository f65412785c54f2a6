"""`gpuroute scale`'s loop: read every router's `/admin/autoscale`, take per pool the most
any asks for (router/core/scale_targets.py) and hand it to an executor when it changed.

An executor is anything with `apply(targets)`: a command, a webhook
(router/scaling/executors.py), or the testbed's local hosts. A failed call is logged and
made again at the next round; a router that does not answer is logged and its last answer
stands for a while, so it cannot shrink a pool by going quiet."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from gpuroute.router.core.scale_targets import PoolTarget, RouterAnswers, read_answer

log = logging.getLogger("gpuroute.scale")
AUTOSCALE_PATH = "/admin/autoscale"
DEFAULT_INTERVAL_S = 15.0  # until a router says its own (the router's default interval_s)


class ExecutorFailed(Exception):
    """The executor did not take the targets (why, in a line)."""


class Executor(Protocol):
    name: str

    async def apply(self, targets: Mapping[str, PoolTarget]) -> None:
        """Make the fleet follow `targets`; ExecutorFailed when it could not be told."""

    async def close(self) -> None: ...


@dataclass(frozen=True)
class RouterAdmin:
    """A router's admin listener (its base URL) and the admin token to send it."""

    url: str
    token: str | None = None


class Scaler:
    def __init__(
        self,
        routers: list[RouterAdmin],
        executor: Executor,
        *,
        interval_s: float | None = None,
        stale_after_s: float = 300.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`interval_s`: None follows the routers' own `interval_s` (the shortest)."""
        self.routers, self.executor = routers, executor
        self.answers = RouterAnswers([r.url for r in routers], stale_after_s)
        self.fixed_interval_s, self.timeout_s, self.clock = interval_s, timeout_s, clock
        self.rounds = 0
        self.calls = 0  # executor calls made (taken or not)

    @property
    def interval_s(self) -> float:
        return self.fixed_interval_s or self.answers.interval_s() or DEFAULT_INTERVAL_S

    async def round(self, session: aiohttp.ClientSession) -> bool:
        """Read the routers, call the executor if due. False when no router's answer
        counts or the executor failed (the --once exit status)."""
        self.rounds += 1
        await asyncio.gather(*(self._read(session, r) for r in self.routers))
        now = self.clock()
        if self.answers.targets(now) is None:
            log.warning("no router answered %s; nothing to do", AUTOSCALE_PATH)
            return False
        targets = self.answers.due(now)
        if targets is None:
            return True
        self.calls += 1
        try:
            await self.executor.apply(targets)
        except ExecutorFailed as exc:
            self.answers.failed()
            log.error("executor %s failed: %s; again in %.0f s", self.executor.name, exc,
                      self.interval_s)  # fmt: skip
            return False
        self.answers.applied(targets)
        sizes = ", ".join(f"{p} {t.active}+{t.standby}" for p, t in sorted(targets.items()))
        log.info("executor %s took: %s", self.executor.name, sizes or "no pools")
        return True

    async def _read(self, session: aiohttp.ClientSession, router: RouterAdmin) -> None:
        headers = {"Authorization": f"Bearer {router.token}"} if router.token else {}
        url = router.url + AUTOSCALE_PATH
        try:
            async with session.get(url, headers=headers) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise ValueError(f"status {response.status}: {text}")
                interval, pools = read_answer(await response.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            log.warning("router %s: %s (its last answer stands for %.0f s)", url, exc,
                        self.answers.stale_after_s)  # fmt: skip
            return
        self.answers.answered(router.url, self.clock(), interval, pools)

    async def run(self, stop: asyncio.Event, rounds: int | None = None) -> bool:
        """A round every interval until `stop` is set (or `rounds` were made); returns
        the last round's outcome."""
        ok = False
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                ok = await self.round(session)
                if rounds is not None and self.rounds >= rounds:
                    break
                with contextlib.suppress(TimeoutError):  # the interval passed: next round
                    await asyncio.wait_for(stop.wait(), self.interval_s)
        return ok
