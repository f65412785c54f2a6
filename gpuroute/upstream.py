"""The HTTP/1.1 client of the router (to engines) and the global tier (to routers):
keep-alive connections per origin, answers parsed by httptools (llhttp, as in uvicorn).

Why not aiohttp's ClientSession: at 32 connections (`gpuroute bench overhead`) it took a
fifth of the router's CPU building objects, URLs, timers and hooks for what is one write and
one parse. This does what a proxy needs: one `writelines` per request, first-byte and idle
deadlines, chunked and sized bodies, backpressure (`Body`), TLS, a pool that never hands
out a connection the engine has closed or left out of step. In order: where to (`Origin`)
and the request head, with the framing its own and nothing that could end a header line
early; the answer as the relay sees it (`Headers`, `Body`); the connection and its pool."""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
UNSAFE_VALUE = re.compile(r"[\r\n\x00]")
# never taken from the caller: the client writes its own framing
OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass(frozen=True, slots=True)
class Origin:
    host: str
    port: int
    tls: bool
    host_header: str

    @property
    def address(self) -> str:
        """host:port, as logs and metrics name it."""
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        default = port == (443 if tls else 80)
        return cls(host, port, tls, shown if default else f"{shown}:{port}")


def request_head(
    method: str, target: str, origin: Origin, headers: Mapping[str, str], length: int
) -> bytes:
    """The request line and headers. A name or value that could end a header line early
    is refused, never sent (header injection into the engine connection)."""
    if not TOKEN.fullmatch(method) or UNSAFE_VALUE.search(target) or " " in target:
        raise ValueError(f"unsafe request line: {method!r} {target!r}")
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"]
    if length or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {length}\r\n")
    # every name a token and no value with a line break or NUL, checked over them all at
    # once (two scans, not two a header); the one at fault named when one is
    names, values = "".join(headers), "".join(headers.values())
    if (names and not TOKEN.fullmatch(names)) or not all(headers) or UNSAFE_VALUE.search(values):
        unsafe = next(
            n for n, v in headers.items() if not TOKEN.fullmatch(n) or UNSAFE_VALUE.search(v)
        )
        raise ValueError(f"unsafe header {unsafe!r}")
    for name, value in headers.items():
        if name.lower() not in OWN_HEADERS:
            lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


# -- the answer as the relay sees it -----------------------------------------------------
# Past this many buffered bytes the connection stops reading until the relay catches up:
# a slow client must slow the engine's socket, not grow the router's memory.
HIGH_WATER = 256 * 1024


class Flow(Protocol):
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Headers:
    """An answer's header lines in arrival order; lookups ignore case (they are few)."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[str, str]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        for key, value in self.raw:
            if key.lower() == name:
                return value
        return default

    def items(self) -> Iterator[tuple[str, str]]:
        return iter(self.raw)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


class Body:
    """An answer's body as it arrives. `readany()` returns everything buffered (one write
    for the relay however the engine's packets fell); an exception set by the connection or
    the relay's idle watch is raised to the reader, as aiohttp's StreamReader does."""

    __slots__ = ("_chunks", "_eof", "_exc", "_flow", "_paused", "_size", "_waiter")

    def __init__(self, flow: Flow | None = None) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._flow, self._paused = flow, False

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and self._flow is not None and not self._paused:
            self._paused = True
            self._flow.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        self._exc = exc
        self._wake()

    @property
    def paused(self) -> bool:
        return self._paused

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    async def readany(self) -> bytes:
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._exc is not None:
            raise self._exc
        chunks, self._chunks, self._size = self._chunks, [], 0
        if self._paused and self._flow is not None:
            self._paused = False
            self._flow.resume_reading()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def read(self) -> bytes:
        """The whole body (small answers: errors, passthrough paths, health checks)."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


# -- connections and the pool -----------------------------------------------------------
KEEPALIVE_S = 30.0  # a connection idle longer than this is closed, not reused
MAX_IDLE_PER_ORIGIN = 256
# An answer's head (interim 1xx heads included) past these is a broken or hostile engine:
# without them its headers would pile up in memory until the first-byte deadline.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 128


class ConnectFailed(OSError):
    """The connection could not be opened: refused, unreachable, or TLS refused."""

    def __init__(self, origin: Origin, cause: OSError) -> None:
        super().__init__(f"cannot connect to {origin.address}: {cause!r}")
        self.cause = cause


class UpstreamClosed(ConnectionResetError):
    """The engine closed the connection before its answer was complete."""


class UpstreamProtocolError(OSError):
    """The engine's bytes are not HTTP/1.1."""


class UpstreamResponse:
    """An answer: status and headers now, the body as it comes. `release()` hands a
    finished connection back to the pool; `close()` drops it."""

    __slots__ = ("_connection", "content", "headers", "status")

    def __init__(self, status: int, headers: Headers, connection: Connection) -> None:
        self.status, self.headers = status, headers
        self.content = Body(connection.transport)
        self._connection = connection

    def release(self) -> None:
        self._connection.done()

    def close(self) -> None:
        self._connection.close()

    async def read(self) -> bytes:
        return await self.content.read()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    def finish(self) -> None:
        """Done with it: its connection back to the pool when the body was read to its
        end, else closed (a connection with a body left in it cannot be reused)."""
        if self.content.at_eof():
            self.release()
        else:
            self.close()

    async def __aexit__(self, *_exc: object) -> None:
        self.finish()


class Connection(asyncio.Protocol):
    """One keep-alive connection, one exchange at a time. httptools calls the `on_*`
    methods while `data_received` feeds it."""

    def __init__(self, pool: UpstreamPool, origin: Origin) -> None:
        self.pool, self.origin = pool, origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.loop = asyncio.get_running_loop()
        self.lost = False
        self.timer: asyncio.TimerHandle | None = None  # lives across exchanges, see _arm
        self.timer_at = 0.0
        self.busy = False  # an exchange is under way (bytes outside one are a broken engine)
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.response: UpstreamResponse | None = None
        self.raw_headers: list[tuple[str, str]] = []
        self.answered = False  # any byte of the answer arrived
        self.head_bytes = 0  # bytes received before the answer's headers were complete
        self.complete = False
        self.keep_alive = False  # read when the answer completes (llhttp forgets it after)
        self.framed = True  # sized or chunked (else the body ends when the engine closes)
        self.head = False
        self.failed = False  # the first failure is the one the reader sees
        self.sent_at = self.last_bytes = 0.0
        self.body_started = False

    # -- one exchange ----------------------------------------------------------------------
    async def exchange(self, parts: list[bytes], head: bool) -> UpstreamResponse:
        """Send a request and wait for its answer's headers. The first-byte deadline runs
        until the first body bytes (a stream's headers may come before the engine has
        prefilled); then the idle deadline, between any two reads."""
        assert self.transport is not None
        self._reset()
        self.head, self.busy = head, True
        self.waiter = self.loop.create_future()
        self.transport.writelines(parts)
        self.sent_at = self.loop.time()
        self._arm(self.sent_at + self.pool.first_byte_timeout_s)
        try:
            return await self.waiter
        except BaseException:
            self.close()
            raise

    def done(self) -> None:
        """The caller is finished with the answer: reuse the connection if it can be."""
        self.busy = False
        response, self.response = self.response, None
        # a body left paused (unread past HIGH_WATER) would hold the next answer back
        held = response is not None and response.content.paused
        if self.complete and self.keep_alive and self.framed and not self.lost and not held:
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()
        self.lost = True
        self.pool.forget(self)

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.close()  # nothing was asked: these bytes cannot be trusted on a reuse
            return
        self.answered = True
        self.last_bytes = self.loop.time()
        started = self.body_started
        try:
            self.parser.feed_data(data)
            if self.response is None:  # still in the head (interim heads count too)
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD_BYTES:
                    raise UpstreamProtocolError(f"its headers exceed {MAX_HEAD_BYTES} bytes")
        except (httptools.HttpParserError, UpstreamProtocolError) as exc:
            # a callback's own refusal reaches us wrapped, as "User callback error"
            reason = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
            self._fail(UpstreamProtocolError(f"malformed answer from the engine: {reason}"))
            self.close()
            return
        if self.body_started and not started and not self.complete:
            self._arm(self.last_bytes + self.pool.idle_timeout_s)  # now the idle deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_timer()
        self.pool.forget(self)
        if self.complete:
            return
        response = self.response
        if response is not None and not self.framed:
            self.complete = True
            response.content.feed_eof()  # a body without length ends with the connection
            return
        self._fail(UpstreamClosed(f"the engine closed the connection mid-answer ({exc!r})"))

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request: the connection is out of step
            raise UpstreamProtocolError("the engine sent bytes after its answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.raw_headers) >= MAX_HEADERS:
            raise UpstreamProtocolError(f"more than {MAX_HEADERS} headers")
        self.raw_headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: an interim answer, the real one follows
            self.raw_headers = []
            return
        headers = Headers(self.raw_headers)
        self.framed = (
            "content-length" in headers
            or "chunked" in (headers.get("transfer-encoding") or "")
            or status in (204, 304)
        )
        self.response = response = UpstreamResponse(status, headers, self)
        if self.head:  # no body follows a HEAD's headers, whatever they say
            self._finished()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(response)

    def on_body(self, body: bytes) -> None:
        self.body_started = True
        if self.response is not None:
            self.response.content.feed(body)

    def on_message_complete(self) -> None:
        if self.response is not None and not self.complete:
            self.keep_alive = self.parser.should_keep_alive()
            self._finished()

    # -- endings ---------------------------------------------------------------------------
    def _finished(self) -> None:
        self.complete = True
        assert self.response is not None
        self.response.content.feed_eof()

    def _arm(self, deadline: float) -> None:
        """Have the timer fire no later than `deadline`. One that fires sooner stays: `_check`
        re-arms it to the deadline then. So a keep-alive connection serving short exchanges
        arms about one timer per deadline period, not a timer and a cancel per request."""
        if self.timer is not None:
            if self.timer_at <= deadline:
                return
            self.timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_at(deadline, self._check)

    def _check(self) -> None:
        """The one timer of an exchange: re-armed to the current deadline, never per read.
        While the body is paused (the relay is behind a slow client) the engine's silence
        is ours, and does not count. Between exchanges it finds nothing to do."""
        self.timer = None
        if self.complete or not self.busy:
            return
        now, pool = self.loop.time(), self.pool
        if self.response is not None and self.response.content.paused:
            self.last_bytes = now
        if self.body_started:
            since, wait = self.last_bytes, pool.idle_timeout_s
            message = f"no bytes from the engine for {wait:g} s"
        else:
            since, wait = self.sent_at, pool.first_byte_timeout_s
            message = f"no answer from the engine in {wait:g} s"
        if now < since + wait:
            self._arm(since + wait)
            return
        self._fail(TimeoutError(message))
        self.close()

    def _fail(self, exc: BaseException) -> None:
        if self.failed:
            return
        self.failed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        elif self.response is not None and not self.complete:
            self.response.content.set_exception(exc)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class UpstreamPool:
    """Keep-alive connections to engines, an idle list per origin (newest reused first)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        first_byte_timeout_s: float,
        idle_timeout_s: float,
        tls: ssl.SSLContext | None = None,
        keepalive_s: float = KEEPALIVE_S,
        clock: Callable[[], float] = time.monotonic,
        on_open: Callable[[str, str], None] | None = None,
    ) -> None:
        self.connect_timeout_s, self.first_byte_timeout_s = connect_timeout_s, first_byte_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.tls, self.keepalive_s = tls, keepalive_s
        self.clock = clock
        self.on_open = on_open  # (host:port, "empty" or "replaced"): for a metric
        self.idle: dict[Origin, list[Connection]] = {}
        self.origins: dict[str, Origin] = {}
        self.open: set[Connection] = set()
        self.closed = False

    async def request(
        self,
        method: str,
        base_url: str,
        target: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> UpstreamResponse:
        """Send one request to `base_url` + `target`. A reused connection that the engine
        had closed before it saw the request is replaced by a new one, once."""
        origin = self.origins.get(base_url) or self._origin(base_url)
        head = request_head(method, target, origin, headers or {}, len(body))
        parts, is_head = [head, body] if body else [head], method == "HEAD"
        why, lost = "empty", None
        if (connection := self._take(origin)) is not None:
            try:
                return await connection.exchange(parts, is_head)
            except UpstreamClosed as closed:
                if connection.answered:
                    raise
                why, lost = "replaced", closed
        try:
            connection = await self._connect(origin, why)
        except ConnectFailed:
            if lost is None:
                raise
            raise lost from None  # the engine went away under the request
        return await connection.exchange(parts, is_head)

    def put(self, connection: Connection) -> None:
        idle = self.idle.setdefault(connection.origin, [])
        if self.closed or len(idle) >= MAX_IDLE_PER_ORIGIN:
            connection.close()
            return
        connection.idle_since = self.clock()
        idle.append(connection)

    def forget(self, connection: Connection) -> None:
        self.open.discard(connection)
        idle = self.idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    async def close(self) -> None:
        self.closed = True
        for connection in list(self.open):
            connection.close()

    def _origin(self, base_url: str) -> Origin:
        origin = self.origins[base_url] = Origin.parse(base_url)
        return origin

    def _take(self, origin: Origin) -> Connection | None:
        idle = self.idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.lost and self.clock() - connection.idle_since < self.keepalive_s:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, why: str) -> Connection:
        loop = asyncio.get_running_loop()
        context = None
        if origin.tls:
            if self.tls is None:
                self.tls = ssl.create_default_context()  # the system's CAs, names checked
            context = self.tls
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context else None,
                )
        except TimeoutError:
            raise TimeoutError(f"connecting to {origin.address} took too long") from None
        except OSError as exc:
            raise ConnectFailed(origin, exc) from exc
        self.open.add(connection)
        if self.on_open is not None:
            self.on_open(origin.address, why)
        return connection
