"""A regional router registers itself in its region's Consul as `gpuroute-router`, so the
global tier can find it through WAN federation (`?dc=<region>`) instead of a static list.
Consul checks `/readyz` itself (an HTTP check): a draining or backend-less router turns
critical and drops out of the global tier's view."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from gpuroute.router.config.router import RouterConfig

from gpuroute.consul_client import ConsulClient, ConsulUnavailable, check_meta
from gpuroute.runtime import BackgroundLoop

log = logging.getLogger("gpuroute.router.backends.registration")
SERVICE = "gpuroute-router"


def readyz_url(config: RouterConfig, port: int, admin_port: int | None) -> str:
    """Where the local Consul agent checks /readyz: the admin listener (plain HTTP, on this
    host) when there is one, so a public listener with mutual TLS needs no client
    certificate for the check; else the public port."""
    if admin_port is None:
        listen, bound = config.listen, port
    else:
        listen, bound = config.admin_listen, admin_port
    return f"{listen.scheme}://{_local(listen.host)}:{bound}/readyz"


def _local(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::", "localhost") else host


def router_service(
    config: RouterConfig, port: int, report_port: int, address: str, admin_port: int | None
) -> dict:
    sid = f"{SERVICE}-{socket.gethostname()}-{port}"
    return {
        "ID": sid,
        "Name": SERVICE,
        "Address": address,
        "Port": port,
        "Tags": ["gpuroute", f"region-{config.region.name}"],
        "Meta": check_meta(
            {
                "region": config.region.name,
                "report_port": str(report_port),
                "scheme": config.listen.scheme,
            }
        ),
        "Check": {
            "CheckID": f"{sid}:readyz",
            "Name": "router /readyz",
            "HTTP": readyz_url(config, port, admin_port),
            "TLSSkipVerify": True,  # a loopback hop to our own listener
            "Interval": "1s",
            "Timeout": "1s",
            "DeregisterCriticalServiceAfter": "5m",
        },
    }


class RouterRegistration:
    """Registers once Consul answers, and again if Consul forgets (restart)."""

    def __init__(self, client: ConsulClient, service: dict) -> None:
        self.client, self.service = client, service
        self.registered = False
        self._loop_task = BackgroundLoop()

    def start(self) -> None:
        self._loop_task.start(self._loop())

    async def _loop(self) -> None:
        backoff = 0.5
        while True:
            try:
                if self.service["ID"] not in await self.client.local_service_ids():
                    await self.client.register(self.service)
                    log.info("registered %s in Consul", self.service["ID"])
                self.registered, backoff = True, 5.0
            except ConsulUnavailable as exc:
                log.warning("router registration: %s", exc)
                self.registered, backoff = False, min(backoff * 2, 5.0)
            await asyncio.sleep(backoff)  # re-check period (a Consul restart forgets us)

    async def close(self) -> None:
        await self._loop_task.stop()
        with contextlib.suppress(ConsulUnavailable):
            await self.client.deregister(self.service["ID"])
