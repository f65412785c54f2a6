"""Slow and greedy clients (issue 16 item 11): 100 trickling connections stayed open 130 s,
with no deadline for headers or body, no per-address cap, and a huge declared body read
before it was refused."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest
from support.live import async_wait_for, holds, router_server, scripted_backend
from support_security import (
    ANSWER,
    RecordingEngine,
    chat,
    error_of,
    raw_exchange,
    secure_toml,
    status_of,
)

pytestmark = pytest.mark.asyncio


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Does the server close `sock` within `seconds` (while we send nothing more)?"""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def test_a_trickled_request_head_is_cut_off(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, limits="header_timeout_s = 0.5")
        async with router_server(text, tmp_path) as server:
            started = time.monotonic()

            def trickle() -> bool:
                with socket.create_connection(("127.0.0.1", server.port)) as s:
                    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                    for _ in range(3):
                        s.sendall(b"X-Slow: 1\r\n")  # bytes keep coming, the head never ends
                        time.sleep(0.1)
                    return closed_within(s, 5.0)

            assert await asyncio.to_thread(trickle)
            assert time.monotonic() - started < 4.0


async def test_connections_per_address_are_capped(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, limits="max_connections_per_ip = 3")
        async with router_server(text, tmp_path) as server:

            def fourth_is_refused() -> tuple[bool, bool]:
                held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
                try:
                    extra = socket.create_connection(("127.0.0.1", server.port))
                    refused = closed_within(extra, 3.0)
                    extra.close()
                    kept = not closed_within(held[0], 0.2)
                    return refused, kept
                finally:
                    for s in held:
                        s.close()

            refused, kept = await asyncio.to_thread(fourth_is_refused)
            assert refused and kept
            healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

            async def served_again() -> bool:  # the cap counts open connections, not past ones
                answer = await asyncio.to_thread(raw_exchange, server.port, healthz, 1.0)
                return status_of(answer) == 200

            await async_wait_for(served_again, 10, "a new connection once the others closed")


# what both tiers answer (gpuroute/openai_api.py read_body), at the default max_body_bytes
TOO_LARGE = {
    "message": "request body exceeds 8388608 bytes",
    "type": "invalid_request_error", "param": None, "code": None,
}  # fmt: skip
TRICKLED = {
    "message": "request body not received within 0.5 s",
    "type": "timeout_error", "param": None, "code": "body_timeout",
}  # fmt: skip


async def test_huge_declared_body_refused_before_reading(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        async with router_server(secure_toml(url), tmp_path) as server:
            head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{"
            )
            answer = await asyncio.to_thread(raw_exchange, server.port, head, 5.0)
            assert (status_of(answer), error_of(answer)) == (413, TOO_LARGE)


async def test_a_chunked_body_past_the_limit_is_refused_when_it_came_whole(tmp_path) -> None:
    """No length declared, the whole body in one write (read as it lies, without aiohttp's
    own reading loop): still refused past max_body_bytes, never forwarded."""
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, limits="max_body_bytes = 1024")
        async with router_server(text, tmp_path) as server:
            body = b'{"model": "m", "prompt": "' + b"x" * 2000 + b'"}'
            head = (
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            answer = await asyncio.to_thread(raw_exchange, server.port, head + chunked, 5.0)
            too_large = {**TOO_LARGE, "message": "request body exceeds 1024 bytes"}
            assert (status_of(answer), error_of(answer)) == (413, too_large)
    assert engine.seen == []


async def test_a_trickled_body_gets_408(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, limits="body_timeout_s = 0.5")
        async with router_server(text, tmp_path) as server:
            head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mod'
            )
            answer = await asyncio.to_thread(raw_exchange, server.port, head, 5.0)
            assert (status_of(answer), error_of(answer)) == (408, TRICKLED)


async def test_the_global_tier_reads_bodies_the_same_way(tmp_path) -> None:
    """The internet-facing tier refuses a huge declared body before reading it and a
    trickled one with 408, through the same read_body as the routers."""
    from gpuroute.global_.config import load_global_config
    from gpuroute.global_.server import GlobalApp, GlobalServer
    from support.paths import REPO

    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    (tmp_path / "global.toml").write_text(
        'regions_file = "regions.toml"\n[listen]\nport = 0\n[admin_listen]\nport = 0\n'
        "[limits]\nbody_timeout_s = 0.5\n"
        '[[endpoints]]\nregion = "eu-west"\nurl = "http://127.0.0.1:1"\nreport = "127.0.0.1:2"\n'
    )
    server = GlobalServer(GlobalApp(*load_global_config(tmp_path / "global.toml")))
    await server.start()
    try:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        )
        huge = head + b"Content-Length: 1000000000\r\n\r\n{"
        answer = await asyncio.to_thread(raw_exchange, server.port, huge, 5.0)
        assert (status_of(answer), error_of(answer)) == (413, TOO_LARGE)
        trickled = head + b'Content-Length: 100\r\n\r\n{"mod'
        answer = await asyncio.to_thread(raw_exchange, server.port, trickled, 5.0)
        assert (status_of(answer), error_of(answer)) == (408, TRICKLED)
    finally:
        await server.drain(timeout=1.0)


class EndlessEngine:
    """Streams 16 KiB events for as long as the router reads them to a request that asks
    for `forever`; answers anything else at once. Counts the endless streams cut off."""

    def __init__(self) -> None:
        self.streaming = 0
        self.cut_off = 0

    async def __call__(self, request):
        from aiohttp import web

        body = await request.read()
        if b"forever" not in body:
            return web.json_response(ANSWER)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.streaming += 1
        event = b'data: {"choices":[{"delta":{"content":"' + b"x" * 16384 + b'"}}]}\n\n'
        try:
            while True:
                await response.write(event)
        except (ConnectionError, asyncio.CancelledError):
            self.cut_off += 1
            raise


def stalled_reader(port: int) -> socket.socket:
    """A client that asks for an endless stream and never reads a byte of it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    body = chat("forever", stream=True)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return s


async def test_clients_that_stop_reading_cannot_pin_a_backend(tmp_path) -> None:
    """Issue 30 item 6: two stream clients that stopped reading held both of a backend's
    slots for 22 s and more, and another tenant's request got 504. Past the write deadline
    they are cut off, their engine requests aborted, and the next request is served."""
    engine = EndlessEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(
            url, limits="client_write_timeout_s = 0.5", admission="default_timeout_s = 8"
        ).replace("\n[[backends]]", "\n[[backends]]\nmax_inflight = 2")
        async with router_server(text, tmp_path) as server:
            readers = [await asyncio.to_thread(stalled_reader, server.port) for _ in range(2)]
            try:
                await async_wait_for(holds(lambda: engine.streaming == 2), what="both streams")
                started = time.monotonic()
                answer = await asyncio.to_thread(
                    raw_exchange, server.port, post(chat("just a question"))
                )
                waited = time.monotonic() - started
                cut = server.servable.metrics.client_write_timeouts._value
                await async_wait_for(holds(lambda: cut.get() == 2), what="both readers cut off")
            finally:
                for reader in readers:
                    reader.close()
    assert status_of(answer) == 200 and waited < 6.0, (answer[:120], waited)
    assert engine.cut_off == 2


def post(body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


async def test_behind_a_trusted_proxy_each_forwarded_client_is_capped(tmp_path) -> None:
    """Issue 30: the per-address connection cap counted the load balancer's idle
    keep-alive sockets, and behind an L7 balancer every client shares its address. Now
    the proxy's connections are not capped; each client its X-Forwarded-For names is held
    to as many requests in flight."""
    engine = RecordingEngine()
    engine.hold = asyncio.Event()
    async with scripted_backend(engine) as url:
        text = secure_toml(
            url, top='trusted_proxies = ["127.0.0.1/32"]', limits="max_connections_per_ip = 3"
        )
        async with router_server(text, tmp_path) as server:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"

            def through_the_proxy(client: str) -> asyncio.Task:
                headers = {"Content-Type": "application/json", "X-Forwarded-For": client}
                return asyncio.create_task(session.post(base, data=chat(), headers=headers))

            connector = aiohttp.TCPConnector(limit=0)  # one connection a request, as a proxy
            async with aiohttp.ClientSession(connector=connector) as session:
                held = [through_the_proxy("198.51.100.7") for _ in range(3)]
                held += [through_the_proxy(f"203.0.113.{i}") for i in range(5)]
                await async_wait_for(holds(lambda: engine.started == 8), what="8 in flight")
                async with await through_the_proxy("198.51.100.7") as fourth:
                    assert fourth.status == 429
                    assert (await fourth.json())["error"]["code"] == "too_many_connections"
                engine.hold.set()
                async with asyncio.timeout(30):
                    assert [(await task).status for task in held] == [200] * 8
