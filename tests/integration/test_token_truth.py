"""Token-level truth (issue 34 item 2): over a replay of 1,200 requests (chat and
completions, streamed and not, a quarter of them CJK), the router's
`gpuroute_tokens_total` equals the fake engines' own counters exactly (ratio 1.000), and a
client that did not ask for usage never sees the usage chunk the router asked for. And
(issue 42 finding 1) each request's usage record is its engine's usage, exactly, for every
API, whatever vLLM adds to an answer around `usage`."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.live import (
    MODEL,
    async_wait_for,
    fake_engines,
    router_toml,
    running_router,
)
from support.token_replay import replay_bodies, router_tokens
from support.usage_truth import usage_cases, usage_truth

pytestmark = pytest.mark.asyncio

REQUESTS = 1200
CONCURRENCY = 16


def sums(text: str, names: dict[str, str]) -> dict[str, float]:
    """Samples of the named metrics summed over their labels, keyed by `names`' values."""
    totals = dict.fromkeys(names.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return totals


async def send(session: aiohttp.ClientSession, url: str, route: str, body: dict) -> None:
    async with session.post(url + route, json=body) as r:
        data = await r.read()
    assert r.status == 200, data
    if not body.get("stream"):
        return
    events = [e for e in data.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    usage_only = [c for c in chunks if c["choices"] == [] and "usage" in c]
    asked = "stream_options" in body
    assert len(usage_only) == int(asked), data


async def test_tokens_total_equals_the_engines_own_counters(tmp_path) -> None:
    requests = replay_bodies(REQUESTS, MODEL)
    with fake_engines(("H100", 0.02), ("A100", 0.02)) as engines:
        # no rescues: a request moved off a backend that seemed slow before its first byte
        # leaves work that engine counted and no client got (a CI run on a loaded machine:
        # "moved 1 requests off ejected or slow backends", the engines 39 prompt and 10
        # completion tokens ahead), which is no answer's; what is counted here is answers'
        config = router_toml([(e.url, e.gpu) for e in engines], retry="rescue_slowness = 0")
        async with running_router(config, tmp_path) as (url, router), aiohttp.ClientSession() as s:
            queue = asyncio.Queue()
            for item in requests:
                queue.put_nowait(item)

            async def worker() -> None:
                while not queue.empty():
                    route, body = queue.get_nowait()
                    await send(s, url, route, body)

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            theirs = {"prompt": 0.0, "completion": 0.0}
            names = {
                "vllm:prompt_tokens_total": "prompt",
                "vllm:generation_tokens_total": "completion",
            }
            for engine in engines:
                async with s.get(engine.url + "/metrics") as r:
                    for k, v in sums(await r.text(), names).items():
                        theirs[k] += v
            # a request's tokens are counted as its exchange settles, which may come a hair
            # after its client read the last byte: equal within a bound, never short
            ours: dict = {}

            async def counted() -> bool:
                ours.update(router_tokens(router.metrics.render().decode()))
                return ours == theirs

            with contextlib.suppress(AssertionError):
                await async_wait_for(counted, 5, "the router's counts equal to the engines'")
    assert theirs["prompt"] > 0 and theirs["completion"] > 0
    for direction in ("prompt", "completion"):
        ratio = ours[direction] / theirs[direction]
        print(
            f"{direction}: router {ours[direction]:.0f}, engines {theirs[direction]:.0f},"
            f" ratio {ratio:.3f}"
        )
        assert ours[direction] == theirs[direction], (direction, ours, theirs)


# -- usage truth under every body field vLLM can add (issue 42 finding 1) -------------------
LONG = "route this request well please " * 400  # ~3,000 tokens: ids and logprobs of 10+ KB


async def test_usage_recorded_is_the_engines_for_every_api_and_extra(tmp_path) -> None:
    """The usage record of each request equals the usage its engine answered, exactly:
    chat, completions, Responses, Messages (streamed and not, with `return_token_ids`,
    `prompt_logprobs`, `return_prompt_text`, short and long prompts), embeddings, rerank."""
    with fake_engines(("H100", 0.001)) as (engine,):
        config = router_toml([(engine.url, "H100")])  # admin on the public listener
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            cases = usage_cases(MODEL, ("hi there", LONG))
            wrong, served = await usage_truth(s, url, engine.url, cases)
    assert wrong == [], wrong
    assert served == 76, served  # all but streams asking for prompt_logprobs (vLLM's 400)
