"""An upstream that dies mid-body: on both tiers the client must see an error, never a short
body that looks complete (an SSE error event on a stream; an incomplete body otherwise)."""

from __future__ import annotations

import contextlib
import time

import aiohttp
import pytest
from aiohttp import web
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import REGION_HEADER, GlobalApp, GlobalServer
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK
from support.live import MODEL, chat_body, free_port, router_toml, running_router
from support.live import scripted_backend as upstream_server
from support.paths import REPO

from gpuroute.proto import load_pb2

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
        assert body.startswith(SSE_EVENTS)
        assert b'"upstream_stream_error"' in body and body.endswith(b"data: [DONE]\n\n")
    else:
        assert body is None, f"a truncated body looked complete: {body!r}"
        assert error == "ClientPayloadError"


@pytest.mark.parametrize("stream", [False, True])
async def test_router_never_relays_a_truncated_body_as_complete(tmp_path, stream) -> None:
    async with upstream_server(truncating) as engine:
        config = router_toml([(engine, "H100")], retry="max_attempts = 1")
        async with running_router(config, tmp_path) as (url, _router):
            assert_ends_as_error(*await fetch(url, stream), stream)


@contextlib.asynccontextmanager
async def global_tier(tmp_path, region_url: str):
    """The global tier in front of one 'region' whose router is `region_url`; the region is
    made up by feeding it a report directly (no gRPC stream in this test)."""
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    (tmp_path / "global.toml").write_text(
        GLOBAL_ON_LOOPBACK + 'regions_file = "regions.toml"\ntick_s = 0.05\n[listen]\nport = 0\n'
        "[region_health]\nup_after_s = 0.0\n"
        f'[[endpoints]]\nregion = "eu-west"\nurl = "{region_url}"\n'
        f'report = "127.0.0.1:{free_port()}"\n'
    )
    app = GlobalApp(*load_global_config(tmp_path / "global.toml"))
    server = GlobalServer(app)
    await server.start()
    report = load_pb2.RegionReport(routable_backends=1, models=[MODEL], timestamp=time.time())
    app.feeds.on_report("eu-west", report)
    app.feeds.tick()
    assert [v.name for v in app.feeds.views if v.up] == ["eu-west"]
    try:
        yield f"http://127.0.0.1:{server.port}", app
    finally:
        await server.drain(timeout=2.0)


@pytest.mark.parametrize("stream", [False, True])
async def test_global_tier_never_relays_a_truncated_body_as_complete(tmp_path, stream) -> None:
    async with upstream_server(truncating) as region:
        async with global_tier(tmp_path, region) as (url, app):
            status, body, error = await fetch(url, stream)
            if stream:
                assert_ends_as_error(status, body, error, stream)
            else:  # one JSON document is read whole first: a broken one is a failed attempt
                assert status == 502 and error is None and body is not None
                assert b'"upstream_error"' in body
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
