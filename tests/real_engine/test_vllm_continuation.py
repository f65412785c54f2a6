"""A real vLLM killed mid-stream, with a second one beside it: the router continues the
answer there and the official `openai` client reads one complete answer. vLLM streams its
token ids (`return_token_ids`), so the count of tokens sent is exact and a completion goes
on from a token-id prompt; greedy decoding makes the continued answer checkable token for
token against the same request run whole."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
from gpuroute.testbed.real_vllm import VllmOptions, start_vllm
from openai import AsyncOpenAI
from support.live import counter, router_toml, running_router
from support.real_engine import SERVED, need_vllm

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]
MAX_TOKENS = 600
KILL_AFTER = 40  # chunks the client has read when the engine serving it dies
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS}
EXTRA = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture
def three_vllms(tmp_path):
    """Three real vLLMs of the same tiny model (the same dummy weights: the same greedy
    text), started at once: two to kill, one to finish on."""
    need_vllm()
    with ThreadPoolExecutor(3) as pool:
        starting = [pool.submit(start_vllm, tmp_path / n, VllmOptions(max_num_seqs=4))
                    for n in "abc"]  # fmt: skip
    engines = [s.result() for s in starting if s.exception() is None]
    try:
        assert len(engines) == 3, [s.exception() for s in starting]
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def whole(url: str, route: str, body: dict) -> dict:
    """The same request run whole on one engine: the reference answer."""
    data = json.dumps({"model": SERVED, **GREEDY, **EXTRA, **body}).encode()
    request = urllib.request.Request(url + route, data, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())["choices"][0]


async def continued(url: str, engines, route: str, body: dict) -> tuple[list, list, list, object]:
    """The request streamed through the router; the engine serving it is killed after
    KILL_AFTER chunks. Its text pieces, token ids, finish reasons and usage."""
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    api = client.completions if route == "/v1/completions" else client.chat.completions
    stream = await api.create(model=SERVED, stream=True, stream_options={"include_usage": True},
                              extra_body=EXTRA, **GREEDY, **body)  # fmt: skip
    serving = stream.response.headers["x-gpuroute-backend"]
    pieces, ids, finishes, usage, read = [], [], [], None, 0
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text = choice.text if route == "/v1/completions" else choice.delta.content
            pieces.append(text or "")
            ids += (choice.model_extra or {}).get("token_ids") or []
            finishes.append(choice.finish_reason)
        read += 1
        if read == KILL_AFTER:
            next(e for e in engines if f":{e.port}" in serving).kill()
    await client.close()
    return pieces, ids, finishes, usage


async def test_a_stream_whose_vllm_dies_is_finished_by_another_token_for_token(
    three_vllms, tmp_path
) -> None:
    """A completion and a chat (each continued from token ids: the chat as a completion), each
    killed mid-stream in turn: both read as the same request run whole."""
    prompt = "the answer is"
    chat = {"messages": [{"role": "user", "content": prompt}]}
    bodies = {"/v1/completions": {"prompt": prompt}, "/v1/chat/completions": chat}
    references = {route: whole(three_vllms[0].url, route, b) for route, b in bodies.items()}
    config = router_toml([(e.url, "L4") for e in three_vllms], model=SERVED)  # names backends
    async with running_router(config, tmp_path) as (url, router):
        async with aiohttp.ClientSession() as s:  # the router asks vLLM for ids; this
            plain = {"model": SERVED, "stream": True, "max_tokens": 8, **chat}  # client did not
            async with s.post(url + "/v1/chat/completions", json=plain) as r:
                raw = await r.read()
        assert raw.endswith(b"data: [DONE]\n\n") and b"token_ids" not in raw
        assert b'"usage"' not in raw
        for went_on, (route, body) in enumerate(bodies.items(), 1):
            pieces, ids, finishes, usage = await continued(url, three_vllms, route, body)
            # (its engine died with the answer under way: the rest came from another)
            assert counter(router, "gpuroute_stream_continuations", reason="engine_broke",
                           outcome="continued") == went_on  # fmt: skip
            reference = references[route]
            text = reference.get("text") or reference["message"]["content"]
            print(f"\n{route}: {len(pieces)} chunks, {len(ids)} token ids, usage {usage}")
            assert len(reference["token_ids"]) == MAX_TOKENS
            assert [f for f in finishes if f] == ["length"]  # one finish, as vLLM ends it
            assert usage.completion_tokens == MAX_TOKENS  # ignore_eos: the budget, no more
            assert ids == reference["token_ids"]  # no token duplicated, dropped or changed
            assert "".join(pieces) == text
