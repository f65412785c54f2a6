"""SIGTERM drains the router process: no new connections, in-flight streams complete, and
/readyz on the admin listener says 503 meanwhile. A stream still running when the drain
time runs out ends with an error event, and the router exits then."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import subprocess

import aiohttp
import pytest
from aiohttp import web
from support.live import (
    async_wait_for,
    chat_body,
    fake_engines,
    free_port,
    gpuroute_cmd,
    http_ok,
    router_toml,
    scripted_backend,
    stream_error,
    wait_for,
)


def test_sigterm_finishes_in_flight_streams_then_exits(tmp_path) -> None:
    with fake_engines(("L4", 5.0)) as (engine,):
        port = free_port()
        path = tmp_path / "router.toml"
        path.write_text("drain_timeout_s = 60\n" + router_toml([(engine.url, "L4")], port=port))
        router = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(path)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: http_ok(url + "/readyz"), 20, "router ready")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body = json.dumps(chat_body(stream=True, max_tokens=40))
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200
            received = response.read1()
            router.send_signal(signal.SIGTERM)
            # the listener closes while our stream is still being served
            wait_for(lambda: not http_ok(url + "/healthz"), 10, "listener closed")
            received += response.read()
            conn.close()
            assert received.endswith(b"data: [DONE]\n\n")
            assert received.count(b" tok") == 40
            assert router.wait(30) == 0
        finally:
            if router.poll() is None:
                router.kill()
            router.stderr.close()


class HeldStream:
    """An engine whose stream sends one event, then waits for `finish` to end."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        await self.finish.wait()
        await response.write(b'data: {"choices":[{"delta":{"content":"b"}}]}\n\ndata: [DONE]\n\n')
        return response


def router_with_admin_listener(
    tmp_path, engine_url: str, top: str = "", stderr=subprocess.DEVNULL
) -> tuple[subprocess.Popen, int, int]:
    """`gpuroute router` with its admin routes on their own listener (`top`: more top-level
    keys): (process, its public port, its admin port)."""
    port, admin_port = free_port(), free_port()
    text = router_toml([(engine_url, "L4")], port=port, admin_listen=f"port = {admin_port}")
    path = tmp_path / "router.toml"
    path.write_text(top + text.replace("admin_on_public_listener = true\n", ""))
    command = gpuroute_cmd("router", "--config", str(path))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    return process, port, admin_port


DRAINING = {"error": {"message": "draining", "type": "service_unavailable", "param": None,
                      "code": "draining"}}  # fmt: skip


@pytest.mark.asyncio
async def test_readyz_answers_503_draining_while_a_stream_drains(tmp_path) -> None:
    """docs/operations.md: on SIGTERM the admin listener stays up and its /readyz says 503
    `draining` (so a load balancer stops sending) until the last stream is done."""
    engine = HeldStream()
    async with scripted_backend(engine) as url, aiohttp.ClientSession() as s:
        router, port, admin_port = router_with_admin_listener(tmp_path, url)
        readyz = f"http://127.0.0.1:{admin_port}/readyz"

        async def readiness() -> tuple[int, dict | None]:
            try:
                async with s.get(readyz) as r:
                    return r.status, await r.json()
            except aiohttp.ClientConnectionError:
                return 0, None

        async def ready_is(status: int) -> bool:
            return (await readiness())[0] == status

        try:
            await async_wait_for(lambda: ready_is(200), 20, "router ready")
            post = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with s.post(post, json=chat_body(stream=True)) as stream:
                assert stream.status == 200
                first = await stream.content.readuntil(b"\n\n")
                router.send_signal(signal.SIGTERM)
                await async_wait_for(lambda: ready_is(503), 10, "/readyz to say draining")
                assert await readiness() == (503, DRAINING)
                assert router.poll() is None  # still draining: the stream is not done
                engine.finish.set()
                rest = await asyncio.wait_for(stream.content.read(), 10)
            assert (first + rest).endswith(b"data: [DONE]\n\n")
            assert await asyncio.to_thread(router.wait, 30) == 0
        finally:
            if router.poll() is None:
                router.kill()
                router.wait(10)


@pytest.mark.asyncio
async def test_a_stream_past_the_drain_time_ends_with_an_error_event_and_the_router_exits(
    tmp_path,
) -> None:
    """The engine never ends its stream. With `drain_timeout_s = 1` the router cuts it
    then: the client's stream ends with an error event and [DONE] (not a connection closed
    mid-event), the access log says 503, and the router exits; before, aiohttp's own
    shutdown let the stream run 60 s more and the log called it cut."""
    engine = HeldStream()
    log = tmp_path / "router.log"
    async with scripted_backend(engine) as url, aiohttp.ClientSession() as s:
        with log.open("wb") as stderr:
            router, port, admin_port = router_with_admin_listener(
                tmp_path, url, "drain_timeout_s = 1\n", stderr
            )
        try:
            ready = f"http://127.0.0.1:{admin_port}/readyz"
            await async_wait_for(lambda: asyncio.to_thread(http_ok, ready), 20, "router ready")
            post = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with s.post(post, json=chat_body(stream=True)) as stream:
                assert stream.status == 200
                first = await stream.content.readuntil(b"\n\n")
                router.send_signal(signal.SIGTERM)
                rest = await asyncio.wait_for(stream.content.read(), 20)
            error = stream_error(first + rest, first)
            assert "drain time ran out" in error["message"], error
            assert await asyncio.to_thread(router.wait, 20) == 0
            assert not engine.finish.is_set()  # the engine's stream never ended by itself
        finally:
            if router.poll() is None:
                router.kill()
                router.wait(10)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    cut = [line for line in lines if line.get("route") == "/v1/chat/completions"]
    assert [line["status"] for line in cut] == [503], cut
    assert any("drain timeout (1 s): 1 requests cut" in line["message"] for line in lines)
