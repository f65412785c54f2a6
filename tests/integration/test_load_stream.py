"""The agent's gRPC load stream against a real grpc.aio client on loopback."""

from __future__ import annotations

import asyncio
import itertools
import time

import grpc
import pytest
from gpuroute.agent.load_stream import (
    AgentLoadService,
    LoadBroadcaster,
    LoadSample,
    start_load_server,
)

from gpuroute.proto import load_pb2, load_pb2_grpc

pytestmark = pytest.mark.asyncio


async def test_first_report_at_once_changes_at_once_heartbeats_within_250ms() -> None:
    broadcaster = LoadBroadcaster("engine-a", time.time)
    await broadcaster.publish(LoadSample(running=1, health="passing"))
    service = AgentLoadService(broadcaster, heartbeat_s=0.25)
    server, port = await start_load_server(service, "127.0.0.1", 0)
    received: list[tuple[float, load_pb2.LoadReport]] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = load_pb2_grpc.AgentLoadStub(channel).WatchLoad(
                load_pb2.WatchLoadRequest(router_id="t")
            )
            started = time.monotonic()
            async for report in stream:
                received.append((time.monotonic() - started, report))
                if len(received) == 4:  # two heartbeats, then a change
                    await broadcaster.publish(LoadSample(running=9, waiting=2, health="passing"))
                if len(received) == 6:
                    break
            stream.cancel()
    finally:
        await server.stop(0)
    first = received[0][1]
    assert (first.backend_id, first.seq, first.running, first.health) == (
        "engine-a", 1, 1, "passing",
    )  # fmt: skip
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(received)]
    # heartbeats repeat the last sample every 250 ms (generous slack: a shared machine)
    assert min(gaps[:3]) > 0.2 and max(gaps[:3]) < 0.75, gaps
    assert [r.seq for _, r in received[:4]] == [1, 1, 1, 1]  # heartbeats repeat the seq
    change = received[4]
    assert (change[1].seq, change[1].running, change[1].waiting) == (2, 9, 2)
    assert change[0] - received[3][0] < 0.2  # a change does not wait for the heartbeat


async def test_noise_below_decision_thresholds_does_not_bump_seq() -> None:
    b = LoadBroadcaster("x", time.time)
    await b.publish(LoadSample(running=1, gpu_util=0.50))
    await b.publish(LoadSample(running=1, gpu_util=0.52, kv_cache_usage=0.005))
    assert b.seq == 1
    await b.set_health("draining")
    assert b.seq == 2 and b.report().health == "draining"


async def test_busy_port_is_a_clear_error() -> None:
    b = LoadBroadcaster("x", time.time)
    server, port = await start_load_server(AgentLoadService(b, 0.25), "127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match="cannot listen"):
            await start_load_server(AgentLoadService(b, 0.25), "127.0.0.1", port)
    finally:
        await server.stop(0)
    await asyncio.sleep(0)
