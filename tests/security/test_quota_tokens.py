"""Token quotas charged on real tokens (issue 30 item 5). A request without `max_tokens`
was charged 1 output token whatever it generated (15,000 tokens went through a 2,000 TPM
key in a minute); token-id prompts were charged almost nothing (3,000 ids as 5 tokens);
CJK text at characters / 4; `tools`, `tool_calls`, images and `n` not at all. Now the
charge at admission is bounded from above and settled against the engine's usage."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import aiohttp
import pytest
from aiohttp import web
from support import components
from support.live import MODEL, router_server, scripted_backend, shared_redis
from support.redis_server import RedisServer
from support_security import KEY, keys_section, secure_toml

from gpuroute.prompt import estimate_tokens, prompt_tokens

AUTH = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
UNBOUNDED_OUTPUT = 300  # what the engine generates when max_tokens does not stop it
TPM = 120_000


def true_prompt(body: dict) -> int:
    """The engine's own count, which is not the router's estimate: a chat template adds 3
    tokens a message, CJK runs at 1.3 tokens a character; token ids count as themselves."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return len(prompt)
    total = 0
    for message in body.get("messages", []):
        text = message["content"]
        wide = sum(1 for c in text if ord(c) > 127)
        total += 3 + (len(text) - wide) // 4 + int(wide * 1.3)
    return total


class TokenizingEngine:
    """Answers with the usage a real engine reports; records every answer's true cost."""

    def __init__(self) -> None:
        self.used: list[int] = []

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        choices = body.get("n", 1)
        output = body.get("max_tokens") or UNBOUNDED_OUTPUT
        prompt, completion = true_prompt(body), choices * output
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        if not body.get("stream"):
            self.used.append(prompt + completion)
            return web.json_response({"object": "chat.completion", "choices": [], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
        for _ in range(completion):  # one token an event, as vLLM streams by default
            await response.write(b'data: {"choices":[{"delta":{"content":" tok"}}]}\n\n')
        await response.write(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n')
        if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM: a last chunk
            chunk = {"choices": [], "usage": usage}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        self.used.append(prompt + completion)
        return response


def chat(text: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
REPLAY = [
    (CHAT, chat("Summarise the meeting notes for me, please. " * 8)),  # no max_tokens
    (CHAT, chat("請把這份會議紀錄整理成重點，並列出所有待辦事項與負責人。" * 10)),  # CJK
    (COMPLETIONS, {"model": MODEL, "prompt": list(range(3000)), "max_tokens": 50}),  # ids
    (CHAT, chat("Give me four different openings for a short story.", n=4)),  # n > 1
    (CHAT, chat("Stream me a poem about routers.", stream=True)),  # a stream
]


def test_the_charge_counts_what_the_guess_missed() -> None:
    cjk = "請把這份會議紀錄整理成重點"
    assert estimate_tokens(cjk) == len(cjk)  # was len / 4
    assert prompt_tokens({"prompt": list(range(3000))}) == 3000  # was 1
    assert prompt_tokens({"prompt": [[1, 2, 3], [4, 5]]}) == 5
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    assert prompt_tokens({**plain, "tools": tools}) > prompt_tokens(plain) + 10
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with_image = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]
    }
    assert prompt_tokens(with_image) >= 1024
    call = {
        "role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": "{}" * 200}}],
    }
    assert prompt_tokens({"messages": [call]}) > 100


async def replay(base: str, seconds: float, workers: int = 8) -> tuple[float, int]:
    """Send REPLAY round and round from `workers` clients for `seconds`; (elapsed, 200s)."""
    kinds = itertools.cycle(REPLAY)
    started = time.monotonic()
    served = 0

    async def client(s: aiohttp.ClientSession) -> None:
        nonlocal served
        while time.monotonic() - started < seconds:
            path, body = next(kinds)
            async with s.post(base + path, json=body, headers=AUTH) as r:
                await r.read()
                if r.status == 200:
                    served += 1
                else:
                    assert r.status == 429, await r.text()
                    await asyncio.sleep(0.01)  # a client's pause after a 429, not a wait

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(client(s) for _ in range(workers)))
    return time.monotonic() - started, served


def settled(server, tenant: str) -> dict[str, float]:
    """The router's gpuroute_quota_settled_tokens_total for `tenant`, by direction."""
    found = {}
    for family in server.servable.metrics.registry.collect():
        for sample in family.samples:
            ours = sample.name == "gpuroute_quota_settled_tokens_total"
            if ours and sample.labels["tenant"] == tenant:
                found[sample.labels["direction"]] = sample.value
    return found


@pytest.mark.asyncio
async def test_a_cjk_stream_is_settled_on_the_usage_chunk_its_client_never_sees(
    tmp_path,
) -> None:
    """The charge at admission is the router's estimate (CJK at a token a character); the
    engine counts 1.3 tokens a character. The stream's client did not ask for usage: the
    router asks the engine for it, settles the quota on exactly what it reported, and
    drops that chunk from what the client receives."""
    engine = TokenizingEngine()
    text = "請把這份會議紀錄整理成重點，並列出所有待辦事項與負責人。" * 10
    body = chat(text, stream=True, max_tokens=20)
    async with scripted_backend(engine) as url:
        config = secure_toml(url, auth=keys_section(f"tokens_per_minute = {TPM}"))
        async with router_server(config, tmp_path) as server:
            base = f"http://127.0.0.1:{server.port}"
            async with aiohttp.ClientSession() as s:
                async with s.post(base + CHAT, json=body, headers=AUTH) as r:
                    assert r.status == 200, await r.text()
                    received = (await r.read()).decode()
            charged = prompt_tokens(body) + 20
            assert engine.used == [true_prompt(body) + 20]
            assert engine.used[0] > charged  # the estimate missed tokens
            assert settled(server, "acme") == {"debt": engine.used[0] - charged}
    assert '"usage"' not in received and received.count("data: ") == 1 + 20 + 1 + 1
    assert received.rstrip().endswith("data: [DONE]")


@pytest.mark.asyncio
@pytest.mark.parametrize("with_redis", [False, True], ids=["local", "redis"])
async def test_a_token_quota_holds_on_what_engines_report(tmp_path, with_redis: bool) -> None:
    if with_redis:
        components.redis()
    redis = RedisServer(tmp_path) if with_redis else None
    if redis is not None:
        redis.start()
    engine = TokenizingEngine()
    try:
        async with scripted_backend(engine) as url:
            extra = {"redis": shared_redis(redis.url, "share_load = false")} if redis else {}
            text = secure_toml(url, auth=keys_section(f"tokens_per_minute = {TPM}"), **extra)
            async with router_server(text, tmp_path) as server:
                base = f"http://127.0.0.1:{server.port}"
                elapsed, served = await replay(base, 6.0)
    finally:
        if redis is not None:
            redis.stop()
    allowance = TPM + TPM / 60 * elapsed  # a full minute's burst, then the refill
    used = sum(engine.used)
    assert served > 50, served
    assert 0.9 * allowance <= used <= 1.1 * allowance, (used, allowance, served)


class EmbeddingEngine:
    """Answers embeddings with the usage vLLM reports for them (no completion tokens)."""

    async def __call__(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if body["input"].startswith("fail"):
            return web.json_response({"error": "engine failure"}, status=500)
        tokens = len(body["input"]) // 4
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "data": [], "usage": usage})


@pytest.mark.asyncio
async def test_embeddings_and_refused_requests_cost_what_they_used(tmp_path) -> None:
    """An embedding generates nothing, and a request that no engine answered used
    nothing: neither may keep an answer's charge."""
    async with scripted_backend(EmbeddingEngine()) as url:
        text = secure_toml(url, auth=keys_section("tokens_per_minute = 3000"))
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/embeddings"
            statuses = []
            for _ in range(20):  # 20 x 100 tokens under 3,000 a minute
                body = {"model": MODEL, "input": "x" * 400}
                async with s.post(base, json=body, headers=AUTH) as r:
                    statuses.append(r.status)
            assert statuses == [200] * 20
            for _ in range(5):  # 3,000 tokens' worth of requests that no engine answered
                body = {"model": MODEL, "input": "fail" + "x" * 2396}
                async with s.post(base, json=body, headers=AUTH) as r:
                    assert r.status == 502
            async with s.post(base, json={"model": MODEL, "input": "x" * 400}, headers=AUTH) as r:
                assert r.status == 200


def test_a_stream_that_packs_tokens_into_events_is_counted_by_its_text() -> None:
    from gpuroute.relay.body import ResponseTally

    tally = ResponseTally(size_text=True)
    text = "word " * 40  # 200 bytes in one event: about 50 tokens, not 1
    for chunk in (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"' + text.encode() + b'"}}]}\n\n',
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ):
        tally.add(chunk)
    assert tally.used_tokens(streamed=True, prompt_estimate=10) >= 10 + 45
