"""Request metrics through a live router: a stream's first token is its first event with text,
not the role-only event vLLM sends first (a scripted engine waits between them); a stream's
inter-token latency is its mean gap; each backend's latency is timed; requests are counted
by the model that served them, a refused one by the model it asked for, and names the
router does not know fold into `other`."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import pytest
from aiohttp import web
from support.live import MODEL, chat_body, router_toml, running_router, scripted_backend

from gpuroute.openai_api import SSE_DONE, sse_event

pytestmark = pytest.mark.asyncio
CHAT = "/v1/chat/completions"
ROLE_GAP_S = 0.3  # between the role event and the first text
TOKEN_GAP_S = 0.05
TOKENS = 4
STREAMS, WHOLE = 4, 2


def chunk(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return sse_event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                      "model": MODEL, "choices": [choice]})  # fmt: skip


USAGE = {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": 5 + TOKENS}


async def engine(request: web.Request) -> web.StreamResponse:
    """vLLM's shape: the role (empty content) first, then a token an event, the finish, the
    usage when asked for, [DONE]."""
    body = await request.json()
    if not body.get("stream"):
        message = {"role": "assistant", "content": " tok" * TOKENS}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        return web.json_response({"id": "x", "object": "chat.completion", "model": MODEL,
                                  "choices": [choice], "usage": USAGE})  # fmt: skip
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": ""}))
    await asyncio.sleep(ROLE_GAP_S)
    for i in range(TOKENS):
        if i:
            await asyncio.sleep(TOKEN_GAP_S)
        await response.write(chunk({"content": " tok"}))
    end = chunk({}, "length")
    if (body.get("stream_options") or {}).get("include_usage"):
        end += sse_event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                          "model": MODEL, "choices": [], "usage": USAGE})  # fmt: skip
    await response.write(end + SSE_DONE)
    await response.write_eof()
    return response


def config(urls: list[str]) -> str:
    text = router_toml([(url, "L4") for url in urls])  # answers name their backend
    return text + f'[[models]]\nname = "{MODEL}"\naliases = ["llama"]\n'


async def test_request_metrics_time_tokens_backends_and_bound_models(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpuroute.access")
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(scripted_backend(engine)) for _ in range(2)]
        router_url, router = await stack.enter_async_context(running_router(config(urls), tmp_path))
        served: dict[str, int] = {}
        async with aiohttp.ClientSession() as session:

            async def one(stream: bool) -> None:
                async with session.post(router_url + CHAT, json=chat_body(stream=stream)) as r:
                    assert r.status == 200
                    await r.read()
                    backend = r.headers["x-gpuroute-backend"]
                    served[backend] = served.get(backend, 0) + 1

            await asyncio.gather(*(one(i < STREAMS) for i in range(STREAMS + WHOLE)))
            refused = [
                ({**chat_body(), "model": "made-up"}, {}, 404),  # not known here: other
                ({**chat_body(), "model": "llama"}, {"x-gpuroute-fallback": "no"}, 400),
            ]
            for body, headers, status in refused:
                async with session.post(router_url + CHAT, json=body, headers=headers) as r:
                    assert r.status == status
            async with session.post(router_url + CHAT, data=b"{not json") as r:
                assert r.status == 400  # refused before it named a model: ""
        sample = router.metrics.registry.get_sample_value

    def histogram(name: str, **labels: str) -> tuple[float, float]:
        return sample(name + "_sum", labels) or 0.0, sample(name + "_count", labels) or 0.0

    route = {"route": CHAT, "model": MODEL}
    byte_sum, byte_count = histogram("gpuroute_time_to_first_byte_seconds", **route)
    token_sum, token_count = histogram("gpuroute_time_to_first_token_seconds", **route)
    assert byte_count == token_count == STREAMS + WHOLE
    # each stream's first token waits ROLE_GAP_S past its first byte (the role event); a
    # loaded machine may relay a role event late, so half of it: timed at the role event
    # the gap would be about 0 (a CI run saw 0.2885 s a stream, its role events ~12 ms late)
    assert token_sum - byte_sum >= STREAMS * ROLE_GAP_S / 2
    assert byte_sum < STREAMS * ROLE_GAP_S  # the role event went on at once
    lines = [r for r in caplog.records if r.name == "gpuroute.access" and r.status == 200]
    streamed_ttft = sorted(r.ttft_ms for r in lines)[-STREAMS:]  # the access log agrees
    assert len(lines) == STREAMS + WHOLE and min(streamed_ttft) >= 1000 * (ROLE_GAP_S - 0.01)
    itl_sum, itl_count = histogram("gpuroute_inter_token_latency_seconds", model=MODEL)
    assert itl_count == STREAMS
    # the mean gap between text events (a first one relayed late shortens it on a loaded
    # machine, hence half the engine's gap as the floor)
    assert TOKEN_GAP_S / 2 <= itl_sum / itl_count < 4 * TOKEN_GAP_S
    assert len(served) == 2, served  # both backends answered, each timed
    for backend, count in served.items():
        assert histogram("gpuroute_backend_request_duration_seconds", backend=backend)[1] == count
    counted = {
        (s.labels["model"], s.labels["code"]): s.value
        for family in router.metrics.registry.collect()
        if family.name == "gpuroute_requests"
        for s in family.samples
        if s.name == "gpuroute_requests_total"
    }
    assert counted == {(MODEL, "200"): STREAMS + WHOLE, ("other", "404"): 1,
                       ("llama", "400"): 1, ("", "400"): 1}  # fmt: skip
