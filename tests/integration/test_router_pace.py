"""A GPU that turns slow mid-stream, seen live: real fake-engine processes stream through an
in-process router; one engine is slowed 20x while every stream is still decoding, and the
router reads that engine as slow from its streams' pace, before any of them finishes."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from gpuroute.testbed.fake_engine.server import OUTPUT_HEADER
from support.live import async_wait_for, chat_body, fake_engines, holds, router_toml, running_router

pytestmark = pytest.mark.asyncio
STREAMS_PER_ENGINE = 4


async def read_forever(session: aiohttp.ClientSession, url: str, started: asyncio.Event) -> None:
    body = chat_body("tell me a long story", stream=True, max_tokens=4000)
    long = {OUTPUT_HEADER: "4000"}  # the fake engine's answer length (the router relays it)
    async with session.post(url + "/v1/chat/completions", json=body, headers=long) as response:
        assert response.status == 200
        started.set()
        async for _chunk in response.content.iter_any():
            pass


async def test_a_gpu_slowed_mid_stream_is_read_slow_before_its_streams_finish(tmp_path) -> None:
    with fake_engines(*[("H100", 2.0)] * 3) as engines:
        # round robin spreads the streams evenly: each engine gets enough to judge its pace
        config = router_toml([(e.url, "H100") for e in engines], policy="round_robin")
        async with running_router(config, tmp_path) as (url, router):
            ids = [e.url.split("//")[1] for e in engines]
            backends = [router.scheduler.backends.get(i) for i in ids]
            async with aiohttp.ClientSession() as session:
                started = [asyncio.Event() for _ in range(3 * STREAMS_PER_ENGINE)]
                readers = [
                    asyncio.create_task(read_forever(session, url, event)) for event in started
                ]
                try:
                    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
                    async with session.post(engines[0].url + "/_fault", json={"slow": 20}) as r:
                        assert r.status == 200
                    await async_wait_for(
                        holds(lambda: backends[0].slowness >= 5.0),
                        timeout=30,
                        what="the slowed engine read as slow",
                    )
                    assert [b.slowness for b in backends[1:]] == [1.0, 1.0]
                    assert all(not reader.done() for reader in readers)  # none finished
                finally:
                    for reader in readers:
                        reader.cancel()
                    await asyncio.gather(*readers, return_exceptions=True)
