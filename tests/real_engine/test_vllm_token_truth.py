"""Token-level truth against a real vLLM (issue 34 item 2): 1,000 short requests through
the router (chat and completions, streamed and not, some CJK, usage asked for by some
streaming clients), and `gpuroute_tokens_total` equals vLLM's own prompt and generation
counters over them exactly (ratio 1.000)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from gpuroute.testbed.real_vllm import engine_samples
from support.live import router_toml, running_router
from support.real_engine import SERVED
from support.token_replay import replay_bodies, router_tokens

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]
REQUESTS, CONCURRENCY = 1000, 8
COUNTERS = {"prompt": "vllm:prompt_tokens_total", "completion": "vllm:generation_tokens_total"}


async def test_tokens_total_equals_vllms_own_counters(vllm, tmp_path) -> None:
    before = engine_samples(vllm.url)
    requests = replay_bodies(REQUESTS, SERVED, max_output=3)
    config = router_toml([(vllm.url, "L4")], model=SERVED)
    async with running_router(config, tmp_path) as (url, router), aiohttp.ClientSession() as s:
        queue: asyncio.Queue = asyncio.Queue()
        for item in requests:
            queue.put_nowait(item)

        async def worker() -> None:
            while not queue.empty():
                route, body = queue.get_nowait()
                while True:  # a 429 (held past its SLO on a CPU engine) reached no engine
                    async with s.post(url + route, json=body) as r:
                        text = await r.text()
                    if r.status != 429:
                        break
                    await asyncio.sleep(0.2)
                assert r.status == 200, text

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        ours = router_tokens(router.metrics.render().decode())
    after = engine_samples(vllm.url)
    for direction, name in COUNTERS.items():
        theirs = after.get(name, 0.0) - before.get(name, 0.0)
        print(f"{direction}: router {ours[direction]:.0f}, vLLM {theirs:.0f}")
        assert theirs > 0 and ours[direction] == theirs, (direction, ours, theirs)
