"""Token-level truth against a real vLLM (issue 34 item 2): 1,000 short requests through
the router (chat and completions, streamed and not, some CJK, usage asked for by some
streaming clients), and `gpuroute_tokens_total` equals vLLM's own prompt and generation
counters over them exactly (ratio 1.000). And each request's usage record is the usage vLLM
answered it with, whatever vLLM adds around `usage` (issue 42)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from gpuroute.testbed.real_vllm import engine_samples
from support.live import router_toml, running_router
from support.real_engine import SERVED
from support.token_replay import replay_bodies, router_tokens
from support.usage_truth import usage_cases, usage_truth

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


async def test_usage_recorded_is_vllms_for_every_api_and_extra(vllm, tmp_path) -> None:
    """Issue 42 finding 1 against the real engine: each request's usage record equals the
    usage vLLM answered it with, exactly, on every API this model serves (chat,
    completions, Responses, Messages), streamed and not, with `return_token_ids`,
    `prompt_logprobs` and `return_prompt_text`, for a short prompt and a 1,500-token one
    (its ids and logprobs, after `usage` in a chat answer, run to many kilobytes). Greedy,
    so the engine answers the request sent to it directly and through the router alike."""
    long = "route this request well " * 62  # 1,488 bytes: a token a byte on the tiny model
    cases = usage_cases(SERVED, ("hi", long), pooling=False, output=3, temperature=0)
    config = router_toml([(vllm.url, "L4")], model=SERVED)
    async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
        wrong, served = await usage_truth(s, url, vllm.url, cases)
    assert wrong == [], wrong
    assert served == 72, served  # all but streams asking for prompt_logprobs (vLLM's 400)
