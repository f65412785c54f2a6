"""The regional router's report stream for the global tier (gRPC `RegionLoad.WatchRegion`):
a summary at once, then one every `period_s` while the caller listens."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
from gpuroute.router.core.region_summary import RegionSummary

from gpuroute.grpc_server import start_grpc_server
from gpuroute.proto import load_pb2, load_pb2_grpc
from gpuroute.stats import percentile


class RegionReportService(load_pb2_grpc.RegionLoadServicer):
    def __init__(
        self,
        region: str,
        summary: Callable[[], RegionSummary],
        queue_depth: Callable[[], int],
        period_s: float,
        recent: Callable[[], tuple[Sequence[float], Sequence[float]]] = lambda: ((), ()),
    ) -> None:
        self.recent = recent
        self.region = region
        self.summary = summary
        self.queue_depth = queue_depth
        self.period_s = period_s
        self._seq = itertools.count(1)
        self.watchers = 0

    def report(self) -> load_pb2.RegionReport:
        s = self.summary()
        ttft, e2e = self.recent()
        return load_pb2.RegionReport(
            region=self.region,
            seq=next(self._seq),
            timestamp=time.time(),
            utilisation=s.utilisation,
            queue_delay_s=s.queue_delay_s,
            queue_depth=self.queue_depth(),
            routable_backends=s.routable_backends,
            capacity=s.capacity,
            models=list(s.models),
            known_models=list(s.known),
            ttft_p99_s=percentile(ttft, 99, empty=0.0),
            e2e_p99_s=percentile(e2e, 99, empty=0.0),
        )

    async def WatchRegion(
        self, request: load_pb2.WatchRegionRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[load_pb2.RegionReport]:
        self.watchers += 1
        try:
            while True:
                yield self.report()
                await asyncio.sleep(self.period_s)  # the report period
        finally:
            self.watchers -= 1


async def start_region_server(
    service: RegionReportService,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    return await start_grpc_server(
        lambda server: load_pb2_grpc.add_RegionLoadServicer_to_server(service, server),
        host,
        port,
        "region report",
        credentials,
    )
