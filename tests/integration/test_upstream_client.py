"""The router's client to engines (gpuroute/upstream.py) against a loopback server that
writes exactly the bytes each test scripts: reuse, framing, endings, deadlines, refusals."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gpuroute.upstream import (
    HIGH_WATER,
    MAX_HEADERS,
    ConnectFailed,
    Origin,
    UpstreamClosed,
    UpstreamPool,
    UpstreamProtocolError,
    UpstreamResponse,
)

pytestmark = pytest.mark.asyncio
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok"
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request, head and body (sized by Content-Length), as the client wrote it."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


class ScriptedServer:
    """Accepts connections and hands each to `script` with its ordinal; records requests."""

    def __init__(self, script: Script) -> None:
        self.script, self.accepted, self.requests = script, 0, list[bytes]()
        self.server: asyncio.Server | None = None

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        request = await read_request(reader)
        self.requests.append(request)
        return request

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self.script(reader, writer, self.accepted)
        writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@contextlib.asynccontextmanager
async def serving(script: Script) -> AsyncIterator[ScriptedServer]:
    scripted = ScriptedServer(script)
    scripted.server = await asyncio.start_server(scripted._serve, "127.0.0.1", 0)
    try:
        yield scripted
    finally:
        scripted.server.close()


@contextlib.asynccontextmanager
async def pool(
    first_byte_timeout_s: float = 5.0, idle_timeout_s: float = 5.0, opened: list | None = None
) -> AsyncIterator[UpstreamPool]:
    upstream = UpstreamPool(
        connect_timeout_s=2.0,
        first_byte_timeout_s=first_byte_timeout_s,
        idle_timeout_s=idle_timeout_s,
        on_open=None if opened is None else lambda origin, why: opened.append((origin, why)),
    )
    try:
        yield upstream
    finally:
        await upstream.close()


async def test_keep_alive_reuses_one_connection_for_sequential_requests() -> None:
    async def script(reader, writer, _n):
        for _ in range(3):
            await scripted.read_request(reader)
            writer.write(OK)

    opened: list[tuple[str, str]] = []
    async with serving(script) as scripted, pool(opened=opened) as upstream:
        for _ in range(3):
            async with await upstream.request("POST", scripted.url, "/v1/x", b"{}") as answer:
                assert (answer.status, await answer.read()) == (200, b"ok")
        assert scripted.accepted == 1
        assert opened == [(scripted.url.removeprefix("http://"), "empty")]
        first = scripted.requests[0]
        assert first.startswith(b"POST /v1/x HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"Content-Length: 2\r\n" in first and first.endswith(b"\r\n\r\n{}")


async def test_chunked_body_arrives_decoded_in_order() -> None:
    async def script(reader, writer, _n):
        await scripted.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for event in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async with serving(script) as scripted, pool() as upstream:
        answer = await upstream.request("POST", scripted.url, "/s", b"{}")
        assert answer.headers.get("content-type") == "text/event-stream"
        assert await answer.read() == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        assert answer.content.at_eof()
        answer.release()


async def test_a_body_without_length_ends_when_the_engine_closes() -> None:
    async def script(reader, writer, _n):
        await scripted.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")

    async with serving(script) as scripted, pool() as upstream:
        answer = await upstream.request("GET", scripted.url, "/")
        assert await answer.read() == b"all of it"
        answer.release()  # not reusable: closed, never pooled
        assert upstream.idle.get(Origin.parse(scripted.url)) in (None, [])


async def test_a_reused_connection_the_engine_closed_is_replaced_once() -> None:
    """An engine closes idle keep-alive connections (uvicorn after 5 s): a request sent
    on one just as it closes must go out again on a new connection, not fail."""

    async def script(reader, writer, n):
        await scripted.read_request(reader)
        if n == 1:
            writer.write(OK)  # keep-alive promised...
            await scripted.read_request(reader)  # ...then closed as the next one came
            return
        writer.write(OK)

    opened: list[tuple[str, str]] = []
    async with serving(script) as scripted, pool(opened=opened) as upstream:
        for target in ("/a", "/b"):
            async with await upstream.request("POST", scripted.url, target, b"{}") as answer:
                assert await answer.read() == b"ok"
        assert scripted.accepted == 2
        assert [r.split(b" ")[1] for r in scripted.requests] == [b"/a", b"/b", b"/b"]
        assert [why for _, why in opened] == ["empty", "replaced"]


async def test_an_engine_gone_under_a_reused_connection_is_a_lost_connection() -> None:
    """Killed, not merely idle: the new connection is refused, and what the caller sees is
    the connection it lost (a dead engine's in-flight requests must not count as refusals)."""

    async def script(reader, writer, n):
        await scripted.read_request(reader)
        writer.write(OK)
        await scripted.read_request(reader)
        assert scripted.server is not None
        scripted.server.close()  # the engine is gone: nothing listens any more

    async with serving(script) as scripted, pool() as upstream:
        async with await upstream.request("POST", scripted.url, "/a", b"{}") as answer:
            await answer.read()
        with pytest.raises(UpstreamClosed):
            await upstream.request("POST", scripted.url, "/b", b"{}")


async def test_an_answer_released_unread_never_holds_the_next_one_back() -> None:
    """A whole answer larger than HIGH_WATER, released without being read, leaves its
    connection paused: it must be closed, not pooled (the next answer would never come)."""
    body = b"x" * (HIGH_WATER + 50_000)

    async def script(reader, writer, _n):
        while True:
            await scripted.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async with serving(script) as scripted, pool(first_byte_timeout_s=2.0) as upstream:
        answer = await upstream.request("POST", scripted.url, "/a", b"{}")
        async with asyncio.timeout(10):
            while not (answer.content.paused or answer.content._eof):
                await asyncio.sleep(0.01)
        answer.release()
        async with await upstream.request("POST", scripted.url, "/b", b"{}") as second:
            assert await second.read() == body


async def test_bytes_after_an_answer_never_reach_the_next_request() -> None:
    """An engine that sends a second (partial) answer behind the first: the connection is
    out of step and must be dropped, or the next client would get the smuggled bytes."""
    smuggled = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nnot yours"

    async def script(reader, writer, n):
        await scripted.read_request(reader)
        writer.write(OK + (smuggled if n == 1 else b""))
        if n == 1:
            await scripted.read_request(reader)  # it would go on answering on this one
            writer.write(b"x" * 91)

    async with serving(script) as scripted, pool() as upstream:
        for target in ("/a", "/b"):
            async with await upstream.request("POST", scripted.url, target, b"{}") as answer:
                assert await answer.read() == b"ok"
        assert scripted.accepted == 2


async def test_an_engine_dying_mid_body_fails_the_read_never_ends_it() -> None:
    async def script(reader, writer, _n):
        await scripted.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")

    async with serving(script) as scripted, pool() as upstream:
        answer = await upstream.request("POST", scripted.url, "/", b"{}")
        assert await answer.content.readany() == b"partial"
        with pytest.raises(UpstreamClosed):
            await answer.content.readany()
        answer.close()


async def test_a_fresh_connection_closed_before_any_answer_raises() -> None:
    async def script(reader, _writer, _n):
        await scripted.read_request(reader)

    async with serving(script) as scripted, pool() as upstream:
        with pytest.raises(UpstreamClosed):
            await upstream.request("POST", scripted.url, "/", b"{}")
        assert scripted.accepted == 1  # no second try on a connection that was new


@pytest.mark.parametrize(
    ("sent", "deadline", "first", "message"),
    [
        # the headers came, the first body bytes did not: still the first-byte deadline
        (b"", {"first_byte_timeout_s": 0.2}, None, r"no answer from the engine in 0\.2 s"),
        # a chunk came, then nothing: the idle deadline
        (
            b"5\r\nfirst\r\n",
            {"idle_timeout_s": 0.2},
            b"first",
            r"no bytes from the engine for 0\.2 s",
        ),
    ],
)
async def test_a_silent_engine_fails_the_read_at_its_deadline(sent, deadline, first, message):
    released = asyncio.Event()

    async def script(reader, writer, _n):
        await scripted.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + sent)
        await released.wait()

    async with serving(script) as scripted, pool(**deadline) as upstream:
        answer = await upstream.request("POST", scripted.url, "/", b"{}")
        if first is not None:
            assert await answer.content.readany() == first
        loop = asyncio.get_running_loop()
        waited_from = loop.time()
        with pytest.raises(TimeoutError, match=message):
            await answer.content.readany()
        # at its own deadline, not at the other one (5 s) that was armed before it
        assert loop.time() - waited_from < 2.0
        released.set()


async def test_a_reused_connection_keeps_each_exchanges_own_deadline() -> None:
    """The timer outlives an exchange (one per deadline period, not per request): the one
    left by quick answers on this connection must neither cut the next exchange short nor
    let it run past its own deadline."""
    never = asyncio.Event()

    async def script(reader, writer, _n):
        for _ in range(3):
            await scripted.read_request(reader)
            writer.write(OK)
        await scripted.read_request(reader)
        await never.wait()  # the fourth is never answered

    loop = asyncio.get_running_loop()
    async with serving(script) as scripted, pool(first_byte_timeout_s=0.4) as upstream:
        for _ in range(3):
            async with await upstream.request("POST", scripted.url, "/", b"{}") as answer:
                assert await answer.read() == b"ok"
            await asyncio.sleep(0.1)  # the gaps under test: the first timer falls due midway
        sent = loop.time()
        with pytest.raises(TimeoutError, match=r"no answer from the engine in 0\.4 s"):
            await upstream.request("POST", scripted.url, "/", b"{}")
        assert 0.4 <= loop.time() - sent < 1.4
        assert scripted.accepted == 1
        never.set()


LARGE = 64 * 1024 * 1024  # far more than the kernel's loopback buffers hold


def large_answer(sent: asyncio.Event) -> Script:
    """An engine that answers LARGE bytes at once and sets `sent` when all left it."""

    async def script(reader, writer, _n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % LARGE)
        writer.write(b"x" * LARGE)
        await writer.drain()
        sent.set()

    return script


async def until_paused(answer: UpstreamResponse) -> None:
    """Until the client stops reading (past HIGH_WATER buffered)."""
    async with asyncio.timeout(10):
        while not answer.content.paused:
            await asyncio.sleep(0.01)


async def drained(answer: UpstreamResponse) -> int:
    """Reads the body to its end and releases it: the bytes read."""
    total = 0
    while chunk := await answer.content.readany():
        total += len(chunk)
    answer.release()
    return total


async def test_a_paused_body_is_not_the_engines_silence() -> None:
    """Backpressure from a slow client is not an idle engine: five idle deadlines pass
    while the body is held unread, and it still arrives whole."""
    script = large_answer(asyncio.Event())
    async with serving(script) as scripted, pool(idle_timeout_s=0.1) as upstream:
        answer = await upstream.request("POST", scripted.url, "/", b"{}")
        await until_paused(answer)
        await asyncio.sleep(0.5)  # the period under test: five idle deadlines while paused
        assert await drained(answer) == LARGE


async def test_no_headers_within_the_deadline_is_a_timeout() -> None:
    never = asyncio.Event()

    async def script(reader, _writer, _n):
        await scripted.read_request(reader)
        await never.wait()  # the engine never answers

    async with serving(script) as scripted, pool(first_byte_timeout_s=0.2) as upstream:
        with pytest.raises(TimeoutError, match=r"no answer from the engine in 0\.2 s"):
            await upstream.request("POST", scripted.url, "/", b"{}")
        never.set()


async def test_a_refused_connection_says_so() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        async with pool() as upstream:
            with pytest.raises(ConnectFailed) as failed:
                await upstream.request("POST", f"http://127.0.0.1:{port}", "/", b"{}")
    assert isinstance(failed.value.cause, ConnectionRefusedError)


async def test_garbage_from_the_engine_is_a_protocol_error() -> None:
    async def script(reader, writer, _n):
        await scripted.read_request(reader)
        writer.write(b"SPDY/9 what\r\n\r\n")

    async with serving(script) as scripted, pool() as upstream:
        with pytest.raises(UpstreamProtocolError):
            await upstream.request("POST", scripted.url, "/", b"{}")


async def ask_engine_answering_with(header_lines: list[bytes]) -> tuple[int, bytes]:
    """One request to an engine whose answer's head carries `header_lines`, then holds the
    connection open: only a limit can end a head that does not end."""

    async def script(reader, writer, _n):
        await scripted.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for line in header_lines:
            writer.write(line + b"\r\n")
            await writer.drain()
        writer.write(b"Content-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async with serving(script) as scripted, pool(first_byte_timeout_s=30) as upstream:
        async with asyncio.timeout(10):
            async with await upstream.request("POST", scripted.url, "/", b"{}") as answer:
                return answer.status, await answer.read()


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([b"X-Pad: " + b"a" * 1000] * 2000, "headers exceed 65536 bytes"),  # ~2 MB, sent fast
        ([b"X-%d: 1" % i for i in range(MAX_HEADERS + 1)], f"more than {MAX_HEADERS} headers"),
    ],
)
async def test_an_engines_endless_headers_are_refused_not_buffered(lines, message) -> None:
    """A broken or hostile engine cannot fill the router's memory with one answer's head:
    it fails as soon as it passes a limit, long before the first-byte deadline."""
    with pytest.raises(UpstreamProtocolError, match=message):
        await ask_engine_answering_with(lines)


async def test_a_large_head_within_the_limits_is_an_answer() -> None:
    assert await ask_engine_answering_with([b"X-Pad: " + b"a" * 1000] * 60) == (200, b"ok")


async def test_a_slow_reader_pauses_the_engine_socket() -> None:
    """Backpressure: the client buffers about HIGH_WATER, not the whole answer."""
    sent = asyncio.Event()
    async with serving(large_answer(sent)) as scripted, pool() as upstream:
        answer = await upstream.request("POST", scripted.url, "/", b"{}")
        await until_paused(answer)
        assert answer.content._size <= HIGH_WATER + 1024 * 1024
        assert not sent.is_set()  # the engine is held back by the paused socket
        assert await drained(answer) == LARGE
