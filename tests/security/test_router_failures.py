"""What a client can do to the router's bookkeeping and to healthy backends (issue 16 items
5, 6, 19): trip breakers with its own bodies, leak in-flight counts by hanging up, hold a
stream open through a silent engine."""

from __future__ import annotations

import asyncio
import gzip
import re

import aiohttp
import pytest
from aiohttp import web
from support.live import (
    STREAM_BROKE,
    async_wait_for,
    router_server,
    scripted_backend,
    stream_error,
)
from support_security import RecordingEngine, chat, secure_toml

pytestmark = pytest.mark.asyncio
JSON = {"Content-Type": "application/json"}


def second_backend(url: str) -> str:
    return f'[[backends]]\nurl = "{url}"\ngpu = "H100"\nmodels = ["llama-3.1-8b"]\n'


def in_flight_gauge(router) -> float:
    match = re.search(rb"^gpuroute_in_flight ([0-9.]+)$", router.metrics.render(), re.M)
    assert match is not None
    return float(match.group(1))


async def test_a_client_cannot_eject_a_healthy_backend(tmp_path) -> None:
    """Item 5: a gzip body went on with `Content-Encoding: gzip` after the router decoded
    it, the engine answered 500, and five requests ejected the backend. Bodies that make
    every engine fail are the client's doing, not the backends'."""
    poison = RecordingEngine(fail_when=lambda body: b"poison" in body)
    other = RecordingEngine(fail_when=lambda body: b"poison" in body)
    async with scripted_backend(poison) as a, scripted_backend(other) as b:
        text = (
            secure_toml(a) + f'[[backends]]\nurl = "{b}"\ngpu = "H100"\nmodels = ["llama-3.1-8b"]\n'
        )
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            gz = {**JSON, "Content-Encoding": "gzip"}
            for _ in range(8):
                async with s.post(base, data=gzip.compress(chat()), headers=gz) as r:
                    assert r.status == 200
                async with s.post(base, data=chat("poison"), headers=JSON) as r:
                    assert r.status == 502
            health = server.servable.scheduler.health
            for backend in server.servable.scheduler.backends:
                assert health.breaker(backend.backend_id).state.value == "closed"
                assert not health.outliers.is_ejected(backend.backend_id)
    assert all("Content-Encoding" not in h for _, h, _ in poison.seen + other.seen)


async def test_a_broken_backend_is_still_judged(tmp_path) -> None:
    """The other side of item 5: a backend that fails what another answers opens its breaker."""
    broken = RecordingEngine(fail_when=lambda body: True)
    async with scripted_backend(broken) as a, scripted_backend(RecordingEngine()) as b:
        text = (
            secure_toml(a) + f'[[backends]]\nurl = "{b}"\ngpu = "H100"\nmodels = ["llama-3.1-8b"]\n'
        )
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            for _ in range(30):
                async with s.post(base, data=chat(), headers=JSON) as r:
                    assert r.status == 200
            health = server.servable.scheduler.health
            broken_id = next(
                x.backend_id for x in server.servable.scheduler.backends if x.address == a
            )
            judged = health.breaker(broken_id).state.value != "closed"
            assert judged or health.outliers.is_ejected(broken_id)


async def test_hanging_up_at_any_stage_leaks_nothing(tmp_path) -> None:
    """Item 6: each hang-up left gpuroute_in_flight one higher (5 hang-ups: 5), and SIGTERM
    then waited out the drain timeout for requests that did not exist."""
    release = asyncio.Event()
    first_chunk_sent = asyncio.Event()

    async def engine(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b"stream-then-stall" in body:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"choices":[]}\n\n')
            first_chunk_sent.set()
        await release.wait()
        return web.json_response({"choices": []})

    async with scripted_backend(engine) as url:
        text = secure_toml(url).replace(
            'models = ["llama-3.1-8b"]', 'models = ["llama-3.1-8b"]\nmax_inflight = 1'
        )
        async with router_server(text, tmp_path) as server:
            router = server.servable
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            # waiting for the first byte, then queued behind it (max_inflight = 1)
            for stage in ("first byte", "queued"):
                s = aiohttp.ClientSession()
                first = asyncio.create_task(s.post(base, data=chat(), headers=JSON))
                await async_wait_for(_active(router, 1), 5, "one in flight")
                if stage == "queued":
                    queued = asyncio.create_task(s.post(base, data=chat(), headers=JSON))
                    await async_wait_for(_queued(router, 1), 5, "one queued")
                    queued.cancel()
                first.cancel()
                await asyncio.wait_for(s.close(), 10)
                await async_wait_for(_active(router, 0), 5, f"hang-up at {stage}")
            # mid-stream
            s = aiohttp.ClientSession()
            streamed = chat("stream-then-stall", stream=True)
            response = await asyncio.wait_for(s.post(base, data=streamed, headers=JSON), 10)
            await asyncio.wait_for(first_chunk_sent.wait(), 10)
            await asyncio.wait_for(response.content.readany(), 10)
            response.close()
            await s.close()
            await async_wait_for(_active(router, 0), 5, "hang-up mid-stream")
            assert in_flight_gauge(router) == 0
            assert len(router.gate.queue) == 0
            release.set()


def _active(router, n: int):
    async def check() -> bool:
        return router.active == n and in_flight_gauge(router) == n

    return check


def _queued(router, n: int):
    async def check() -> bool:
        return len(router.gate.queue) == n

    return check


async def test_a_silent_engine_ends_the_stream_after_idle_timeout(tmp_path) -> None:
    """Item 19: `limits.idle_timeout_s` was accepted and ignored."""
    stall = asyncio.Event()

    async def engine(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[]}\n\n')
        await stall.wait()
        return response

    async with scripted_backend(engine) as url:
        text = secure_toml(url, limits="idle_timeout_s = 0.3")
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with s.post(base, data=chat(stream=True), headers=JSON) as r:
                body = await asyncio.wait_for(r.content.read(), 10)
            error = stream_error(body, b'data: {"choices":[]}\n\n')
            assert error.pop("message") and error == STREAM_BROKE
        stall.set()
