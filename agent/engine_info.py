"""Asks the engine what it serves (`GET /v1/models`) and how it spans GPUs, so the agent
advertises the engine's own answer rather than a config that may have drifted from it.

Reads are sparse: once at start, every `engine.models_interval_s` (adapters load at run
time), and at once when the engine comes back from a restart (`poke`). The parallel layout
cannot change without a restart, so it is read only then. Until the engine first answers,
the config's word stands (agent/core/engine_facts.py decides, this module only fetches).

The agent registers the engine only once it has loaded its model (`loaded`): the agent's own
/health probe finds it up (`healthy`) and /v1/models lists every name of `engine.models`.
Until then it says what is missing and asks again every `telemetry.health_interval_s`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from gpuroute.agent.config import AgentConfig
from gpuroute.agent.core.engine_facts import (
    PARALLEL_PATHS,
    EngineFacts,
    Parallelism,
    ServedModel,
    facts,
    model_problems,
    parallel_problem,
    parse_models,
    parse_parallel,
)

log = logging.getLogger("gpuroute.agent.engine")


class EngineInfo:
    def __init__(
        self,
        config: AgentConfig,
        on_change: Callable[[EngineFacts], None] = lambda _facts: None,
        healthy: Callable[[], bool] = lambda: True,
    ) -> None:
        self.engine = config.engine
        self.retry_s = config.telemetry.health_interval_s  # until the engine first answers
        self.on_change = on_change
        self.healthy = healthy  # the agent's /health probe's last word (agent/server.py)
        self.served: list[ServedModel] | None = None
        self.reported: Parallelism | None = None
        self.facts = facts(self.engine.models, self.engine.parallel, None, None)
        self.known = asyncio.Event()  # set once there are models to advertise
        if self.facts.models:
            self.known.set()
        self.loaded = asyncio.Event()  # the model is loaded and served: register the engine
        self.reads = 0  # answers from /v1/models, for /status and tests
        self._again = asyncio.Event()
        self._parallel_due = True
        self._said: set[str] = set()

    def poke(self) -> None:
        """The engine (re)started: read it again now, its layout included."""
        self._parallel_due = True
        self._again.set()

    async def run(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.read(session)
            wait = self.engine.models_interval_s if self.loaded.is_set() else self.retry_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._again.wait(), wait)
            self._again.clear()

    async def read(self, session: aiohttp.ClientSession) -> EngineFacts:
        """One round: /v1/models, the layout when due; advertise what changed."""
        served = await self._models(session)
        if served is not None:
            self.served, self.reads = served, self.reads + 1
            self._say(model_problems(self.engine.models, served))
        if self._parallel_due and served is not None:  # the engine is up: ask it once
            self._parallel_due = False
            self.reported = await self._parallel(session)
            if self.reported is not None:
                self._say(
                    parallel_problem(
                        self.engine.parallel, self.engine.parallel_declared, self.reported
                    )
                )
        new = facts(self.engine.models, self.engine.parallel, self.served, self.reported)
        if new != self.facts:
            log.info(
                "engine serves %s (max_model_len %s, %s)",
                ",".join(new.models) or "nothing yet",
                new.max_model_len,
                new.parallel,
            )
            self.facts = new
            self.on_change(new)
        if new.models:
            self.known.set()
        if served is not None and not self.loaded.is_set():
            self._check_loaded(served)
        return new

    def _check_loaded(self, served: list[ServedModel]) -> None:
        """Sets `loaded` once the engine is healthy and /v1/models lists every configured
        model (model_problems has said which are missing). The health probe pokes a read
        when the engine comes up, so this runs again then."""
        ids = {m.id for m in served}
        if any(m not in ids for m in self.engine.models or ()):
            return
        if not self.healthy():
            self._say(f"not registering yet: {self.engine.health_path} is not OK")
            return
        log.info("engine loaded: serves %s, /health OK; registering", ",".join(sorted(ids)))
        self.loaded.set()

    async def _models(self, session: aiohttp.ClientSession) -> list[ServedModel] | None:
        url = self.engine.url + self.engine.models_path
        try:
            body = await self._get_json(session, url)
            served = parse_models(body)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            if self.engine.models is None:
                self._say(
                    f"GET {url}: {type(exc).__name__} {exc}".strip()
                    + "; engine.models is not set, so the agent registers once it answers"
                )
            return None
        if not served:
            self._say(f"GET {url} lists no models; keeping what is advertised")
            return None
        return served

    async def _parallel(self, session: aiohttp.ClientSession) -> Parallelism | None:
        for path in PARALLEL_PATHS.get(self.engine.kind, ()):
            try:
                reported = parse_parallel(
                    self.engine.kind, await self._get_json(session, self.engine.url + path)
                )
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                continue  # most engines do not expose it: the config's degrees stand
            if reported is not None:
                return reported
        return None

    async def _get_json(self, session: aiohttp.ClientSession, url: str) -> Any:
        timeout = aiohttp.ClientTimeout(total=self.engine.metrics_timeout_s)
        async with session.get(url, timeout=timeout) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            return await response.json(content_type=None)

    def _say(self, problem: str | None) -> None:
        """A problem is logged when it first appears, not at every read."""
        if problem is not None and problem not in self._said:
            self._said.add(problem)
            log.warning("%s", problem)
