"""Region state for the global tier: one gRPC report stream per regional router, region
health with hysteresis, spillover state, and the views the policy ranks."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from gpuroute.global_.config import GlobalConfig
from gpuroute.global_.core.geo import Point
from gpuroute.global_.core.policy import RegionView
from gpuroute.global_.core.region_health import RegionHealth, RegionHealthSettings
from gpuroute.global_.core.spillover import Spillover

from gpuroute.grpc_server import channel_credentials, open_channel
from gpuroute.proto import load_pb2, load_pb2_grpc
from gpuroute.regions import FleetConfig
from gpuroute.runtime import cancel_within

log = logging.getLogger("gpuroute.global.feeds")
CLOSE_TIMEOUT_S = 5.0


@dataclass
class RegionFeed:
    name: str
    jurisdiction: str
    location: Point
    url: str | None  # None until configured or discovered
    report_address: str | None
    health: RegionHealth
    utilisation: float = 0.0
    queue_delay_s: float = 0.0
    queue_depth: int = 0
    routable_backends: int = 0
    models: frozenset[str] | None = None
    known: frozenset[str] | None = None  # models its router knows, served now or not
    report_wall: float | None = None
    ttft_p99_s: float = 0.0
    e2e_p99_s: float = 0.0


class RegionFeeds:
    def __init__(
        self,
        config: GlobalConfig,
        fleet: FleetConfig,
        spillover: Spillover,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        on_change: Callable[[str, str], None] = lambda region, state: None,
    ) -> None:
        settings = RegionHealthSettings(**config.region_health.model_dump())
        self.report_credentials = channel_credentials(config.report_tls, "report_tls")
        self.spillover = spillover
        self.clock = clock
        self.rng = rng or random.Random()
        self.on_change = on_change
        endpoints = {e.region: e for e in config.endpoints}
        discovering = config.discovery.consul is not None
        self.feeds: dict[str, RegionFeed] = {}
        for r in fleet.regions:
            e = endpoints.get(r.name)
            if e is None and not discovering:
                continue  # a region with no router to reach: not part of the global tier
            self.feeds[r.name] = RegionFeed(
                r.name, r.jurisdiction, Point(r.location.lat, r.location.lon),
                e.url if e else None, e.report if e else None, RegionHealth(settings),
            )  # fmt: skip
        self.views: list[RegionView] = []
        self._tasks: dict[str, asyncio.Task] = {}
        self._rebuild()

    async def start(self) -> None:
        for feed in self.feeds.values():
            if feed.report_address is not None:
                self._tasks[feed.name] = asyncio.create_task(self._stream(feed))

    def set_endpoint(self, region: str, url: str, report_address: str) -> None:
        """A discovered router: forward there, and stream its reports (restarting the
        stream when the address changed)."""
        feed = self.feeds[region]
        if feed.url == url and feed.report_address == report_address:
            return
        log.info("region %s: router %s (reports %s)", region, url, report_address)
        feed.url, feed.report_address = url, report_address
        if (task := self._tasks.pop(region, None)) is not None:
            task.cancel()
        self._tasks[region] = asyncio.create_task(self._stream(feed))

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        await cancel_within(tasks, timeout_s, "region report streams", log)

    async def _stream(self, feed: RegionFeed) -> None:
        backoff = 0.25
        request = load_pb2.WatchRegionRequest(global_id="gpuroute-global")
        while True:
            try:
                async with open_channel(feed.report_address, self.report_credentials) as channel:
                    stub = load_pb2_grpc.RegionLoadStub(channel)
                    async for report in stub.WatchRegion(request):
                        backoff = 0.25
                        self.on_report(feed.name, report)
            except grpc.aio.AioRpcError as exc:
                log.debug("region %s reports: %s", feed.name, exc.code())
            await asyncio.sleep(backoff * (0.5 + self.rng.random()))  # jittered reconnect
            backoff = min(backoff * 2, 2.0)

    def on_report(self, region: str, r: load_pb2.RegionReport) -> None:
        feed = self.feeds[region]
        feed.utilisation, feed.queue_delay_s = r.utilisation, r.queue_delay_s
        feed.queue_depth, feed.routable_backends = r.queue_depth, r.routable_backends
        feed.models = frozenset(r.models)
        feed.known = frozenset(r.known_models) or None  # none: a router before the field
        feed.ttft_p99_s, feed.e2e_p99_s = r.ttft_p99_s, r.e2e_p99_s
        feed.report_wall = r.timestamp
        self.spillover.update(region, r.utilisation)
        # a region with no routable backend reports, but cannot serve: treat it as silent
        if r.routable_backends > 0:
            self._changed(feed, feed.health.report(self.clock()))
        self._rebuild()

    def forwarded(self, region: str, ok: bool) -> None:
        feed = self.feeds[region]
        self._changed(feed, feed.health.forwarded(ok, self.clock()))

    def tick(self) -> None:
        now = self.clock()
        for feed in self.feeds.values():
            self._changed(feed, feed.health.tick(now))

    def _changed(self, feed: RegionFeed, state) -> None:
        if state is not None:
            log.info("region %s -> %s", feed.name, state.value)
            self.on_change(feed.name, state.value)
            self._rebuild()

    def _rebuild(self) -> None:
        self.views = [
            RegionView(
                f.name,
                f.jurisdiction,
                f.location,
                f.health.up and f.url is not None,
                f.queue_delay_s,
                f.models,
                f.known,
            )
            for f in self.feeds.values()
        ]

    def describe(self) -> list[dict]:
        now = time.time()
        return [
            {
                "region": f.name,
                "jurisdiction": f.jurisdiction,
                "state": f.health.state.value,
                "utilisation": round(f.utilisation, 3),
                "spilling": not self.spillover.can_receive(f.name),
                "spill_fraction": round(self.spillover.fraction(f.name), 3),
                "queue_delay_s": round(f.queue_delay_s, 3),
                "queue_depth": f.queue_depth,
                "routable_backends": f.routable_backends,
                "models": sorted(f.models or ()),
                "ttft_p99_s": round(f.ttft_p99_s, 3),
                "e2e_p99_s": round(f.e2e_p99_s, 3),
                "report_age_s": None if f.report_wall is None else round(now - f.report_wall, 3),
                "url": f.url,
            }
            for f in self.feeds.values()
        ]
