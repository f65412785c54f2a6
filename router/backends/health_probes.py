"""Half-open breakers are decided by health checks, never by clients' requests: one probe
of the backend's health path at a time, its verdict recorded as the breaker's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuroute.router.attempts.forward import Forwarder
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.core.scheduler import Scheduler


class HealthProbes:
    def __init__(
        self,
        config: RouterConfig,
        scheduler: Scheduler,
        forwarder: Forwarder,
        clock: Callable[[], float],
    ) -> None:
        self.config, self.scheduler, self.clock = config, scheduler, clock
        self.forwarder = forwarder  # its pool of connections, the engines' URLs, its metrics
        self._probes: dict[str, asyncio.Task] = {}

    def start(self) -> None:
        """A probe for each half-open backend that has none running (on every tick)."""
        for backend_id in self.scheduler.health.half_open:
            task = self._probes.get(backend_id)
            if task is None or task.done():
                self._probes[backend_id] = asyncio.create_task(self._probe(backend_id))

    def close(self) -> None:
        for task in self._probes.values():
            task.cancel()

    async def _probe(self, backend_id: str) -> None:
        backend = self.scheduler.backends.get(backend_id)
        session = self.forwarder.session
        assert session is not None
        base, path = self.forwarder.urls[backend_id], self.config.health_check_path
        try:
            async with asyncio.timeout(self.config.limits.connect_timeout_s + 2):
                async with await session.request("GET", base, path) as response:
                    ok = response.status == 200
                    await response.read()  # read to the end: the connection is reused
        except (TimeoutError, OSError, ValueError):
            ok = False
        if backend_id in self.scheduler.health.half_open:
            health = self.scheduler.health.record(backend, ok, self.clock())
            self.forwarder.record_health(health)
