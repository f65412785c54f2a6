"""Pools sized by live routers (issue 36): `/admin/autoscale` and the `gpuroute_pool_*`
gauges follow a burst up and a quiet spell down, and two replicas sharing a real
redis-server export the same desired size although only one of them takes the traffic.
A small `capacity_rps` makes the size follow the arrival rate alone."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from aiohttp import web
from support.live import (
    MODEL,
    async_wait_for,
    chat_body,
    router_replicas,
    router_server,
    router_toml,
    scripted_backend,
    shared_redis,
)

pytestmark = pytest.mark.asyncio
# 1 request/s per backend at the 0.8 mark: the desired size is ceil(rate / 0.8)
AUTOSCALE = f"""interval_s = 0.1
capacity_rps = {{ "{MODEL}" = 1.0 }}
lead_time_s = 0
rate_window_s = 0.5
trend_window_s = 1.0
standby_backends = 0
seasonal.enabled = false
"""


async def engine(_request: web.Request) -> web.Response:
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    return web.json_response({"id": "x", "object": "chat.completion", "usage": usage})


async def pool(session: aiohttp.ClientSession, admin: str) -> dict | None:
    async with session.get(admin + "/admin/autoscale") as r:
        assert r.status == 200
        return (await r.json())["pools"].get(MODEL)


@contextlib.asynccontextmanager
async def traffic(url: str, rate_rps: float):
    """Requests sent at about `rate_rps` (each in its own task) until the block ends."""
    answers: list[int] = []

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(url + "/v1/chat/completions", json=chat_body()) as r:
            await r.read()
            answers.append(r.status)

    async def send(session: aiohttp.ClientSession) -> None:
        tasks = set()
        while True:
            task = asyncio.create_task(one(session))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(1 / rate_rps)  # the sending rate, not a synchronisation

    async with aiohttp.ClientSession() as session:
        sender = asyncio.create_task(send(session))
        try:
            yield answers
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender


async def test_desired_size_grows_under_a_burst_and_shrinks_in_the_quiet(tmp_path) -> None:
    async with scripted_backend(engine) as backend:
        text = router_toml([(backend, "H100")], autoscale=AUTOSCALE)
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            url = admin = f"http://127.0.0.1:{server.port}"  # admin on the loopback listener
            sample = server.servable.metrics.registry.get_sample_value
            first = await pool(s, admin)
            assert first is not None and first["desired_backends"] == 1
            assert (first["in_rotation"], first["capacity_rps"]) == (1, 1.0)
            peak: dict = {}

            async def grown() -> bool:
                peak.update(await pool(s, admin) or {})
                return peak.get("desired_backends", 0) >= 4

            async with traffic(url, 20.0) as answers:
                await async_wait_for(grown, 20, "the pool sized up for the burst")
            gauge = sample("gpuroute_pool_desired_backends", {"pool": MODEL})
            assert gauge >= 4 and peak["rate_rps"] > 0.8  # more than one backend's worth
            assert peak["reason"] in ("demand ahead above the high mark", "steady")
            assert set(answers) == {200}

            async def shrunk() -> bool:
                now = await pool(s, admin)
                return now is not None and now["desired_backends"] == 1

            # within seconds, not after scale_down_after_s (300 s): the quiet spell's rule
            await async_wait_for(shrunk, 20, "the pool back to its minimum once quiet")
            quiet = await pool(s, admin)
            assert quiet["reason"] in ("below the low mark", "steady") and quiet["rate_rps"] < 0.8
            assert sample("gpuroute_pool_desired_backends", {"pool": MODEL}) == 1
            assert sample("gpuroute_pool_utilisation", {"pool": MODEL}) < 0.8  # 1 in rotation


async def test_two_replicas_sharing_redis_export_the_same_desired_size(tmp_path, redis) -> None:
    shared = shared_redis(redis.url, "share_load = true\npublish_interval_s = 0.05")
    async with scripted_backend(engine) as backend:
        text = router_toml([(backend, "H100")], autoscale=AUTOSCALE, redis=shared)
        async with router_replicas(text, tmp_path) as (a, b), aiohttp.ClientSession() as s:
            admins = [f"http://127.0.0.1:{r.port}" for r in (a, b)]
            seen: dict[str, list] = {}

            async def agree() -> bool:
                """Both replicas' answers, gauges and own rates, taken together."""
                seen["sizes"] = [await pool(s, admin) for admin in admins]
                gauge = "gpuroute_pool_desired_backends"
                seen["gauges"] = [
                    r.servable.metrics.registry.get_sample_value(gauge, {"pool": MODEL})
                    for r in (a, b)
                ]
                seen["own"] = [r.servable.autoscaler.rates.own.get(MODEL, 0.0) for r in (a, b)]
                # one moment's readings: the answers and the gauges are read a tick apart,
                # and at 8 req/s in a 0.5 s window the size moves between ticks
                if None in seen["sizes"] + seen["gauges"]:
                    return False
                desired = {p["desired_backends"] for p in seen["sizes"]} | set(seen["gauges"])
                return len(desired) == 1 and min(desired) >= 3

            async with traffic(f"http://127.0.0.1:{a.port}", 8.0) as answers:
                await async_wait_for(agree, 20, "both replicas at the same size, above 3")
        print(f"\nreplicas agree: {seen}")
        assert set(answers) == {200}
        desired = seen["sizes"][0]["desired_backends"]
        assert seen["gauges"] == [desired, desired]
        own_a, own_b = seen["own"]
        # b saw no request: it sized on a's rate, shared through Redis
        assert own_b == 0.0 and own_a > 0.0 and seen["sizes"][1]["rate_rps"] > 0.0
