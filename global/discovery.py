"""Regional routers found through Consul: every region is a WAN-federated datacenter named
after it, queried with `?dc=<region>` through the global router's local Consul agent.
Consul unreachable or a region's datacenter silent: the last known (or configured)
endpoints stay; the region's own reports decide whether it is up."""

from __future__ import annotations

import asyncio
import logging
import random

from gpuroute.global_.config import DiscoveryConfig
from gpuroute.global_.feeds import RegionFeeds

from gpuroute.consul_client import ConsulClient, ConsulUnavailable
from gpuroute.runtime import BackgroundLoop
from gpuroute.secrets import read_secret

log = logging.getLogger("gpuroute.global.discovery")


def router_endpoint(entry: dict) -> tuple[str, str] | None:
    """(url, report address) of a gpuroute-router health entry, or None if incomplete."""
    service = entry.get("Service") or {}
    address = service.get("Address") or (entry.get("Node") or {}).get("Address")
    port, report = service.get("Port"), (service.get("Meta") or {}).get("report_port")
    if not address or not port or not report:
        return None
    host = f"[{address}]" if ":" in address else address
    scheme = "https" if (service.get("Meta") or {}).get("scheme") == "https" else "http"
    return f"{scheme}://{host}:{port}", f"{host}:{report}"


class RouterDiscovery:
    def __init__(self, config: DiscoveryConfig, feeds: RegionFeeds, rng: random.Random) -> None:
        assert config.consul is not None
        self.config, self.feeds, self.rng = config, feeds, rng
        token = read_secret(config, "token", "discovery")
        self.client = ConsulClient(config.consul, token=token, timeout_s=config.timeout_s)
        self.reachable = False
        self._loop_task = BackgroundLoop()

    def start(self) -> None:
        self._loop_task.start(self._loop())

    async def close(self) -> None:
        await self._loop_task.stop()
        await self.client.close()

    async def _loop(self) -> None:
        while True:
            await self.discover()
            await asyncio.sleep(self.config.interval_s * (0.75 + self.rng.random() / 2))

    def _keep_or_pick(self, region: str, passing: list[tuple[str, str]]) -> tuple[str, str]:
        """The router in use while it passes; else one of the passing ones at random, so
        that global instances spread over a region's routers (and no single registration,
        first in sort order, draws the whole region's traffic)."""
        feed = self.feeds.feeds[region]
        current = next((p for p in passing if p[0] == feed.url), None)
        return current or self.rng.choice(sorted(passing))

    async def discover(self) -> None:
        try:
            datacenters = set(await self.client.datacenters())
        except ConsulUnavailable as exc:
            if self.reachable:
                log.warning("Consul unreachable (%s): keeping the known routers", exc)
            self.reachable = False
            return
        self.reachable = True
        for region in self.feeds.feeds:
            if region not in datacenters:
                continue
            try:
                _, entries = await self.client.health_service(self.config.service, dc=region)
            except ConsulUnavailable as exc:
                log.debug("datacenter %s: %s", region, exc)
                continue
            passing = [
                ep
                for e in entries
                if all(c.get("Status") == "passing" for c in e.get("Checks") or [])
                and (ep := router_endpoint(e)) is not None
            ]
            if passing:
                self.feeds.set_endpoint(region, *self._keep_or_pick(region, passing))
