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

from gpuroute.proto import load_pb2, load_pb2_grpc
from gpuroute.regions import FleetConfig

log = logging.getLogger("gpuroute.global.feeds")


@dataclass
class RegionFeed:
    name: str
    jurisdiction: str
    location: Point
    url: str
    report_address: str
    health: RegionHealth
    utilisation: float = 0.0
    queue_delay_s: float = 0.0
    queue_depth: int = 0
    routable_backends: int = 0
    models: frozenset[str] | None = None
    report_wall: float | None = None


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
        self.spillover = spillover
        self.clock = clock
        self.rng = rng or random.Random()
        self.on_change = on_change
        self.feeds: dict[str, RegionFeed] = {}
        for e in config.endpoints:
            r = fleet.region(e.region)
            self.feeds[e.region] = RegionFeed(
                r.name, r.jurisdiction, Point(r.location.lat, r.location.lon), e.url, e.report,
                RegionHealth(settings),
            )  # fmt: skip
        self.views: list[RegionView] = []
        self._tasks: list[asyncio.Task] = []
        self._rebuild()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._stream(f)) for f in self.feeds.values()]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _stream(self, feed: RegionFeed) -> None:
        backoff = 0.25
        request = load_pb2.WatchRegionRequest(global_id="gpuroute-global")
        while True:
            try:
                async with grpc.aio.insecure_channel(feed.report_address) as channel:
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
            RegionView(f.name, f.jurisdiction, f.location, f.health.up, f.queue_delay_s, f.models)
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
                "report_age_s": None if f.report_wall is None else round(now - f.report_wall, 3),
                "url": f.url,
            }
            for f in self.feeds.values()
        ]
