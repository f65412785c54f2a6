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

from gpuroute.consul_client import (
    ConsulClient,
    ConsulRejected,
    ConsulUnavailable,
    UnknownCheck,
    check_meta,
)
from gpuroute.gpus import GPU_SPECS

log = logging.getLogger("gpuroute.agent.consul")
AGENT_VERSION = "1"


def service_definition(config: AgentConfig, load_port: int, status: str) -> dict:
    engine, c = config.engine, config.consul
    meta = {
        "region": config.region,
        "zone": config.zone,
        "gpu_model": engine.gpu,
        "gpu_count": str(engine.gpu_count),
        "gpu_memory_gb": f"{GPU_SPECS[engine.gpu].memory_gb:g}",
        "models": ",".join(engine.models),
        "engine_kind": engine.kind,
        "load_port": str(load_port),
        "agent_version": AGENT_VERSION,
        "scheme": urlsplit(engine.url).scheme,  # how routers reach the engine
    }
    if engine.capacity is not None:
        meta["capacity"] = f"{engine.capacity:g}"
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
    ) -> None:
        self.config = config
        self.client = client
        self.load_port = load_port
        self.status = status  # current (Consul status, output)
        self.registered = False
        self.consul_up = False
        self.writes = 0  # registrations and check updates that changed status
        self.changed = asyncio.Event()  # set on a health transition
        self.stopped = False
        self._sent: tuple[str, str] | None = None

    def definition(self) -> dict[str, Any]:
        status, _output = self.status()
        return service_definition(self.config, self.load_port, status)

    async def run(self) -> None:
        refresh = self.config.consul.ttl_s / 3
        backoff = 0.5
        while not self.stopped:
            try:
                if not self.registered:
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
