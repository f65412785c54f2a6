"""Token-level truth (issue 34 item 2): over a replay of 1,200 requests (chat and
completions, streamed and not, a quarter of them CJK), the router's
`gpuroute_tokens_total` equals the fake engines' own counters exactly (ratio 1.000), and a
client that did not ask for usage never sees the usage chunk the router asked for. And
(issue 42 finding 1) each request's usage record is its engine's usage, exactly, for every
API, whatever vLLM adds to an answer around `usage`."""

from __future__ import annotations

import asyncio
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
        config = router_toml([(e.url, e.gpu) for e in engines])
        async with running_router(config, tmp_path) as (url, router), aiohttp.ClientSession() as s:
            queue = asyncio.Queue()
            for item in requests:
                queue.put_nowait(item)

            async def worker() -> None:
                while not queue.empty():
                    route, body = queue.get_nowait()
                    await send(s, url, route, body)

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            ours = router_tokens(router.metrics.render().decode())
            theirs = {"prompt": 0.0, "completion": 0.0}
            names = {
                "vllm:prompt_tokens_total": "prompt",
                "vllm:generation_tokens_total": "completion",
            }
            for engine in engines:
                async with s.get(engine.url + "/metrics") as r:
                    for k, v in sums(await r.text(), names).items():
                        theirs[k] += v
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
EXTRAS = {
    "plain": {},
    "return_token_ids": {"return_token_ids": True},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "return_prompt_text": {"return_prompt_text": True},
    "all": {"return_token_ids": True, "prompt_logprobs": 1, "return_prompt_text": True},
}
GENERATING = {
    "/v1/chat/completions": lambda text: {"messages": [{"role": "user", "content": text}],
                                          "max_tokens": 9},
    "/v1/completions": lambda text: {"prompt": text, "max_tokens": 9},
    "/v1/responses": lambda text: {"input": text, "max_output_tokens": 9},
    "/v1/messages": lambda text: {"messages": [{"role": "user", "content": text}],
                                  "max_tokens": 9},
}  # fmt: skip
POOLING = {
    "/v1/embeddings": lambda text: {"input": [text, "a second one", text]},
    "/v1/rerank": lambda text: {"query": "which", "documents": [text, "short", text]},
}


def usage_cases() -> list[tuple[str, dict]]:
    """(route, body) for each API, streamed and not, with each extra, short and long."""
    cases = []
    for text in ("hi there", LONG):
        for route, make in GENERATING.items():
            for stream in (False, True):
                for extra in EXTRAS.values():
                    cases.append((route, {"model": MODEL, "stream": stream, **make(text), **extra}))
        cases += [(route, {"model": MODEL, **make(text)}) for route, make in POOLING.items()]
    return cases


def engine_usage(status: int, raw: bytes) -> tuple[int, int]:
    """(prompt, completion) as the engine's own answer says, read plainly (json.loads of
    the body or of every event): nothing of the router's reader."""
    if status != 200:
        return 0, 0
    if not raw.lstrip().startswith(b"{"):  # a stream
        usage: dict = {}
        for event in raw.decode().split("\n\n"):
            data = "".join(line[6:] for line in event.splitlines() if line.startswith("data: "))
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            for found in (chunk.get("usage"), (chunk.get("response") or {}).get("usage"),
                          (chunk.get("message") or {}).get("usage")):  # fmt: skip
                usage |= {k: v for k, v in (found or {}).items() if v is not None}
    else:
        usage = json.loads(raw)["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    return prompt, usage.get("completion_tokens", usage.get("output_tokens", 0))


async def record(s: aiohttp.ClientSession, admin: str) -> tuple[int, int, int]:
    async with s.get(admin + "/admin/usage?since=1h") as r:
        total = (await r.json())["total"]
    return total["requests"], total["prompt_tokens"], total["completion_tokens"]


async def test_usage_recorded_is_the_engines_for_every_api_and_extra(tmp_path) -> None:
    """The usage record of each request equals the usage its engine answered, exactly:
    chat, completions, Responses, Messages (streamed and not, with `return_token_ids`,
    `prompt_logprobs`, `return_prompt_text`, short and long prompts), embeddings, rerank."""
    with fake_engines(("H100", 0.001)) as (engine,):
        config = router_toml([(engine.url, "H100")])  # admin on the public listener
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            wrong, served = [], 0
            for route, body in usage_cases():
                asked = body.get("stream") and "completions" in route  # usage, as we ask
                direct = body | ({"stream_options": {"include_usage": True}} if asked else {})
                async with s.post(engine.url + route, json=direct) as r:
                    status, theirs = r.status, engine_usage(r.status, await r.read())
                before = await record(s, url)
                async with s.post(url + route, json=body) as r:
                    await r.read()
                await async_wait_for(lambda b=before: _counted(s, url, b), what=f"{route} recorded")
                after = await record(s, url)
                ours = (after[1] - before[1], after[2] - before[2])
                served += r.status == 200
                if ours != theirs or r.status != status or (theirs == (0, 0) and status == 200):
                    wrong.append((route, body.get("stream"), sorted(body)[:6], ours, theirs))
    assert wrong == [], wrong
    assert served == 76, served  # all but streams asking for prompt_logprobs (vLLM's 400)


async def _counted(s: aiohttp.ClientSession, admin: str, before: tuple[int, ...]) -> bool:
    return (await record(s, admin))[0] > before[0]
