"""An upstream that dies mid-body: on both tiers the client must see an error, never a short
body that looks complete (an SSE error event on a stream; an incomplete body otherwise)."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web
from gpuroute.global_.server import REGION_HEADER
from support.global_tier import global_tier
from support.live import STREAM_BROKE, chat_body, router_toml, running_router, stream_error
from support.live import scripted_backend as upstream_server

pytestmark = pytest.mark.asyncio
PARTIAL_JSON = b'{"id": "cmpl-1", "object": "chat.completion", "choices": [{"mess'
SSE_EVENTS = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n' * 2


async def truncating(request: web.Request) -> web.StreamResponse:
    """Answer 200, send part of the body, then drop the connection (an engine that died)."""
    await request.read()
    streamed = (await request.json()).get("stream", False)
    kind = "text/event-stream" if streamed else "application/json"
    response = web.StreamResponse(headers={"Content-Type": kind})
    if not streamed:
        response.content_length = 4096  # promises more than it sends
    await response.prepare(request)
    await response.write(SSE_EVENTS if streamed else PARTIAL_JSON)
    assert request.transport is not None
    request.transport.close()
    return response


async def fetch(url: str, stream: bool) -> tuple[int, bytes | None, str | None]:
    """(status, body, error): body is None when reading it failed as incomplete."""
    body = chat_body(stream=stream)
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            try:
                return response.status, await response.read(), None
            except aiohttp.ClientPayloadError as exc:
                return response.status, None, type(exc).__name__


def assert_ends_as_error(status: int, body: bytes | None, error: str | None, stream: bool) -> None:
    assert status == 200  # the first bytes were already relayed
    if stream:
        assert error is None and body is not None
        event = stream_error(body, SSE_EVENTS)
        assert event.pop("message") and event == STREAM_BROKE
    else:
        assert body is None, f"a truncated body looked complete: {body!r}"
        assert error == "ClientPayloadError"


@pytest.mark.parametrize("stream", [False, True])
async def test_router_never_relays_a_truncated_body_as_complete(tmp_path, stream) -> None:
    async with upstream_server(truncating) as engine:
        config = router_toml([(engine, "H100")], retry="max_attempts = 1")
        async with running_router(config, tmp_path) as (url, _router):
            assert_ends_as_error(*await fetch(url, stream), stream)


@pytest.mark.parametrize("stream", [False, True])
async def test_global_tier_never_relays_a_truncated_body_as_complete(tmp_path, stream) -> None:
    async with upstream_server(truncating) as region:
        async with global_tier(tmp_path, region) as (url, app):
            status, body, error = await fetch(url, stream)
            if stream:
                assert_ends_as_error(status, body, error, stream)
            else:  # one JSON document is read whole first: a broken one is a failed attempt
                assert (status, error) == (502, None)
                assert json.loads(body or b"{}") == {"error": {
                    "message": "every compliant region failed to answer",
                    "type": "upstream_error", "param": None, "code": "upstream_error",
                }}  # fmt: skip
            # the region failed mid-body: that counts against it
            assert app.feeds.feeds["eu-west"].health.failures == 1


async def test_global_tier_names_the_region_on_complete_bodies(tmp_path) -> None:
    async def whole(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"object": "chat.completion", "choices": []})

    async with upstream_server(whole) as region:
        async with global_tier(tmp_path, region) as (url, app):
            async with aiohttp.ClientSession() as session:
                async with session.post(url + "/v1/chat/completions", json=chat_body()) as r:
                    assert r.status == 200 and r.headers[REGION_HEADER] == "eu-west"
                    assert (await r.json())["object"] == "chat.completion"
            assert app.feeds.feeds["eu-west"].health.failures == 0
