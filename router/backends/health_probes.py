"""Health checks the router makes itself, never through clients' requests:

- active checks: every `health.interval_s`, each backend no agent vouches for (static, or
  added by the admin API) is asked for its health path; `health.failures_out` failed in a
  row take it out of rotation before a request finds it dead (router/core/health.py);
- half-open breakers: one probe of the health path at a time, its verdict the breaker's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuroute.router.attempts.forward import Forwarder
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.core.backend import BackendState
from gpuroute.router.core.breaker import BreakerState
from gpuroute.router.core.health import CHECK_DOWN, CHECK_OK, CHECK_SLOW
from gpuroute.router.core.scheduler import Scheduler

log = logging.getLogger("gpuroute.router.health")

# states in which a backend is not checked: the operator holds it out of rotation
UNCHECKED = frozenset({BackendState.STANDBY, BackendState.DRAINING})


class HealthProbes:
    def __init__(
        self,
        config: Callable[[], RouterConfig],
        scheduler: Scheduler,
        forwarder: Forwarder,
        clock: Callable[[], float],
        vouched_for: Callable[[str], bool] = lambda _backend_id: False,
    ) -> None:
        """`config`: the file in force (a reload replaces it); `vouched_for`: whether an
        agent reports the backend's health (Consul's checks), so it needs no checks here."""
        self.config, self.scheduler, self.clock = config, scheduler, clock
        self.forwarder = forwarder  # its pool of connections, the engines' URLs, its metrics
        self.vouched_for = vouched_for
        self._probes: dict[str, asyncio.Task] = {}
        self._checks: dict[str, asyncio.Task] = {}
        self._next_check = 0.0

    def start(self) -> None:
        """On every tick: a probe for each half-open backend that has none running, and
        the active checks when they are due."""
        for backend_id in self.scheduler.health.half_open:
            task = self._probes.get(backend_id)
            if task is None or task.done():
                self._probes[backend_id] = asyncio.create_task(self._probe(backend_id))
        self._start_checks()

    def close(self) -> None:
        for task in (*self._probes.values(), *self._checks.values()):
            task.cancel()

    def _start_checks(self) -> None:
        settings, now = self.config().health, self.clock()
        if settings.interval_s <= 0 or now < self._next_check:
            return
        self._next_check = now + settings.interval_s
        health = self.scheduler.health
        for backend in self.scheduler.backends:
            backend_id = backend.backend_id
            if (
                backend.state in UNCHECKED
                or backend_id in health.half_open  # its probes decide
                or self.vouched_for(backend_id)
            ):
                continue
            task = self._checks.get(backend_id)
            if task is None or task.done():
                self._checks[backend_id] = asyncio.create_task(self._check(backend_id))
        for backend_id in [b for b, t in self._checks.items() if t.done()]:
            del self._checks[backend_id]  # removed backends' tasks do not pile up

    async def _check(self, backend_id: str) -> None:
        settings = self.config().health
        verdict = await self._verdict(backend_id, settings.timeout_s)
        backends = self.scheduler.backends
        if backend_id not in backends or backend_id in self.scheduler.health.half_open:
            return  # removed meanwhile, or its breaker's probes decide now
        events = self.scheduler.health.checked(
            backends.get(backend_id), verdict, self.clock(), settings.failures_out
        )
        self.forwarder.record_health(events)
        if any(t.after is BreakerState.OPEN for _, t in events.breaker):
            log.warning(
                "backend %s failed %d health checks in a row: out of rotation",
                backend_id, settings.failures_out,
            )  # fmt: skip

    async def _probe(self, backend_id: str) -> None:
        config = self.config()
        verdict = await self._verdict(backend_id, config.limits.connect_timeout_s + 2)
        if backend_id in self.scheduler.health.half_open:
            backend = self.scheduler.backends.get(backend_id)
            health = self.scheduler.health.record(backend, verdict == CHECK_OK, self.clock())
            self.forwarder.record_health(health)

    async def _verdict(self, backend_id: str, timeout_s: float) -> str:
        """CHECK_OK: the health path answered 200 within `timeout_s`; CHECK_SLOW: no answer
        in time; CHECK_DOWN: refused, reset, or any other answer."""
        session = self.forwarder.session
        base = self.forwarder.urls.get(backend_id)
        if session is None or base is None:
            return CHECK_DOWN
        try:
            async with asyncio.timeout(timeout_s):
                async with await session.request(
                    "GET", base, self.config().health_check_path
                ) as response:
                    ok = response.status == 200
                    await response.read()  # read to the end: the connection is reused
        except TimeoutError:
            return CHECK_SLOW
        except (OSError, ValueError):
            return CHECK_DOWN
        return CHECK_OK if ok else CHECK_DOWN
