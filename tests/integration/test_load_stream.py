"""The agent's gRPC load stream against a real grpc.aio client on loopback."""

from __future__ import annotations

import asyncio
import contextlib
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


@contextlib.asynccontextmanager
async def watching(broadcaster: LoadBroadcaster, heartbeat_s: float):
    """A real gRPC client's WatchLoad stream on a loopback load server; yields `read()`,
    which returns the next report and fails when none comes within 10 s."""
    server, port = await start_load_server(
        AgentLoadService(broadcaster, heartbeat_s), "127.0.0.1", 0
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = load_pb2_grpc.AgentLoadStub(channel).WatchLoad(
                load_pb2.WatchLoadRequest(router_id="t")
            )
            reports = aiter(stream)

            async def read() -> load_pb2.LoadReport:
                return await asyncio.wait_for(anext(reports), 10)

            yield read
            stream.cancel()
    finally:
        await server.stop(0)


def load(report: load_pb2.LoadReport) -> tuple:
    return report.backend_id, report.seq, report.running, report.waiting, report.health


async def test_a_quiet_stream_repeats_the_last_sample_as_heartbeats() -> None:
    """Counts, not gaps: with no new sample the stream still sends, and each heartbeat is
    the last sample with its seq unchanged (how often is bench material, not a test's)."""
    broadcaster = LoadBroadcaster("engine-a", time.time)
    await broadcaster.publish(LoadSample(running=1, health="passing"))
    async with watching(broadcaster, heartbeat_s=0.05) as read:
        quiet = [load(await read()) for _ in range(4)]
        await broadcaster.publish(LoadSample(running=9, waiting=2, health="passing"))
        # heartbeats already sent before the change may still be on their way
        after = [load(await read())]
        while after[-1][1] == 1 and len(after) < 1000:
            after.append(load(await read()))
        after.append(load(await read()))  # the change's own heartbeat
    old, new = ("engine-a", 1, 1, 0, "passing"), ("engine-a", 2, 9, 2, "passing")
    assert quiet == [old] * 4
    assert after == [old] * (len(after) - 2) + [new, new]


async def test_first_report_and_changes_go_out_at_once_not_at_the_heartbeat() -> None:
    """With an hour between heartbeats, the first report and a change still arrive (each
    read is bounded by 10 s), and nothing comes between them."""
    broadcaster = LoadBroadcaster("engine-a", time.time)
    await broadcaster.publish(LoadSample(running=1, health="passing"))
    async with watching(broadcaster, heartbeat_s=3600) as read:
        first = await read()
        await broadcaster.publish(LoadSample(running=9, waiting=2, health="passing"))
        change = await read()
    assert [load(first), load(change)] == [
        ("engine-a", 1, 1, 0, "passing"), ("engine-a", 2, 9, 2, "passing"),
    ]  # fmt: skip


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
