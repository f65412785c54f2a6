"""Keeps the host registered in the local Consul agent with a TTL check that tells its health.

The check is refreshed every ttl/3 with the same status and output (Consul does not sync an
unchanged check to the servers, so refreshes cost no Raft write) and updated at once on a
health transition. If Consul restarts or reaps the service, the next update fails with an
unknown check and the service is registered again; if Consul is unreachable, the loop keeps
trying with backoff and re-registers when it comes back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gpuroute.agent.config import AgentConfig
from gpuroute.agent.core.engine_facts import EngineFacts, facts

from gpuroute.consul_client import (
    ConsulClient,
    ConsulRejected,
    ConsulUnavailable,
    UnknownCheck,
    check_meta,
)

log = logging.getLogger("gpuroute.agent.consul")
AGENT_VERSION = "1"


def config_facts(config: AgentConfig) -> EngineFacts:
    """What the config alone says (before the engine has answered, or where it cannot)."""
    return facts(config.engine.models, config.engine.parallel, None, None)


def service_definition(
    config: AgentConfig,
    load_port: int,
    status: str,
    engine_facts: EngineFacts | None = None,
    standby: bool = False,
) -> dict:
    engine, c = config.engine, config.consul
    known = engine_facts or config_facts(config)
    meta = {
        "region": config.region,
        "zone": config.zone,
        "gpu_model": engine.gpu,
        "gpu_count": str(known.parallel.gpus),
        "tensor_parallel": str(known.parallel.tp),
        "pipeline_parallel": str(known.parallel.pp),
        "data_parallel": str(known.parallel.dp),
        "gpu_memory_gb": f"{config.gpu_catalog()[engine.gpu].memory_gb:g}",
        "models": ",".join(known.models),
        "engine_kind": engine.kind,
        "load_port": str(load_port),
        "agent_version": AGENT_VERSION,
        "scheme": urlsplit(engine.url).scheme,  # how routers reach the engine
    }
    if known.max_model_len is not None:
        meta["max_model_len"] = str(known.max_model_len)
    adapters = [m for m in known.adapters if m in known.models]  # those that fit in `models`
    if adapters:  # routers keep each adapter on few engines (LoRA affinity)
        meta["lora_adapters"] = ",".join(adapters)
    if engine.capacity is not None:
        meta["capacity"] = f"{engine.capacity:g}"
    if standby:  # warm, out of rotation: routers bring it in for a burst (router/core/standby.py)
        meta["standby"] = "true"
    return {
        "ID": config.service_id,
        "Name": c.service,
        "Address": config.advertise_address,
        "Port": engine.port,
        "Tags": ["gpuroute", f"gpu-{engine.gpu}", f"region-{config.region}"],
        "Meta": check_meta(meta),
        "Check": {
            "CheckID": check_id(config),
            "Name": "gpuroute agent: engine and GPU health",
            "TTL": f"{c.ttl_s:g}s",
            "Status": status,
            "Notes": "set by gpuroute agent; output says why",
            "DeregisterCriticalServiceAfter": f"{c.deregister_critical_after_s:g}s",
        },
    }


def check_id(config: AgentConfig) -> str:
    return f"gpuroute-agent:{config.service_id}"


class Registration:
    def __init__(
        self,
        config: AgentConfig,
        client: ConsulClient,
        load_port: int,
        status: Callable[[], tuple[str, str]],
        engine_facts: Callable[[], EngineFacts] | None = None,
        ready: asyncio.Event | None = None,
        *,
        standby: Callable[[], bool] = lambda: False,
    ) -> None:
        self.config = config
        self.client = client
        self.load_port = load_port
        self.status = status  # current (Consul status, output)
        self.engine_facts = engine_facts or (lambda: config_facts(config))
        self.ready = ready  # registering waits for it (what the engine serves is known)
        self.standby = standby  # whether the host stands by now (Meta standby)
        self.registered = False
        self.consul_up = False
        self.writes = 0  # registrations and check updates that changed status
        self.changed = asyncio.Event()  # set on a health transition
        self.stopped = False
        self._sent: tuple[str, str] | None = None
        self._stale = False  # the registered Meta is out of date

    def definition(self) -> dict[str, Any]:
        status, _output = self.status()
        facts = self.engine_facts()
        return service_definition(self.config, self.load_port, status, facts, self.standby())

    def refresh(self) -> None:
        """Register again soon: the Meta changed (models, context length, degrees, standby)."""
        self._stale = True
        self.changed.set()

    async def run(self) -> None:
        refresh = self.config.consul.ttl_s / 3
        backoff = 0.5
        if self.ready is not None:
            await self.ready.wait()
        while not self.stopped:
            try:
                if not self.registered or self._stale:
                    await self._register()
                await self._update()
                self.consul_up, backoff = True, 0.5
            except UnknownCheck:
                log.warning("Consul lost the service (restart or reap); registering again")
                self.registered = False
                continue
            except Exception as exc:
                if isinstance(exc, ConsulRejected):  # a missing or weak token: say so each time
                    log.error("Consul refused the registration (check consul.token): %s", exc)
                elif not isinstance(exc, ConsulUnavailable):
                    log.exception("unexpected error talking to Consul")
                elif self.consul_up or self.registered:
                    log.warning("Consul: %s; retrying with backoff", exc)
                self.consul_up, self.registered = False, False
                await self._wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            await self._wait(refresh)

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), seconds)
        self.changed.clear()

    async def _register(self) -> None:
        self._stale = False  # a refresh while this one is on the wire registers again
        definition = self.definition()
        await self.client.register(definition)
        self.registered = True
        self.writes += 1
        self._sent = None  # the output is set by the update that follows
        log.info("registered %s in Consul", self.config.service_id)

    async def _update(self) -> None:
        status, output = self.status()
        await self.client.update_check(check_id(self.config), status, output)
        if (status, output) != self._sent:
            self.writes += 1
            log.info("health check -> %s (%s)", status, output)
        self._sent = (status, output)

    async def maintenance(self, reason: str, enable: bool = True) -> None:
        await self.client.maintenance(self.config.service_id, enable, reason)

    async def deregister(self) -> None:
        self.stopped = True
        self.changed.set()
        await self.client.deregister(self.config.service_id)
        self.registered = False
        log.info("deregistered %s from Consul", self.config.service_id)
