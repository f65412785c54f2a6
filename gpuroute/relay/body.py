"""The one relay both tiers use: header hygiene, writing to the client (with a deadline only
while it is behind), relaying a body, and how a broken one ends."""

from __future__ import annotations

import asyncio
import enum
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from aiohttp import web

from gpuroute.openai_api import SSE_DONE, sse_error
from gpuroute.relay.usage_reader import UsageReader, token_counts
from gpuroute.upstream import UpstreamResponse

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Requests go on with an allow-list of headers (gpuroute/headers.py); answers come back
# without these.
RESPONSE_DROP = HOP_BY_HOP | {"content-length", "date", "server"}
SERVER_NAME = "gpuroute"  # the Server header both tiers send, naming no library or version
# What a failed upstream attempt raises (connect, timeout, reset, protocol errors).
# gpuroute/upstream.py raises only OSError subclasses (TimeoutError is one).
UPSTREAM_ERRORS = (OSError,)
EVENT_TEXT = re.compile(rb'"(?:content|text)"\s*:\s*"((?:[^"\\]|\\.)+)"')
SKELETON_LOOKS = 4  # chunks searched for an event with text before a stream is left unsized
BYTES_PER_TOKEN = 4  # a stream's text without usage: OpenAI's rule of thumb for English
# The cancel message of a request the drain cuts (gpuroute/serving.py): a stream it cuts
# ends with an error event, not a connection closed mid-event.
DRAIN_CUT = "gpuroute: the drain time ran out"


def drain_cut(cancelled: asyncio.CancelledError) -> bool:
    """Whether the drain cut it (else its client left)."""
    return cancelled.args == (DRAIN_CUT,)


def cancelled_status(cancelled: asyncio.CancelledError) -> int:
    """The status a cancelled request is logged with: 503 when the drain cut it, else 499."""
    return 503 if drain_cut(cancelled) else 499


# asyncio's and uvloop's default: a write this large may pause the transport on its own
WRITE_HIGH_WATER = 64 * 1024


class ClientWriter:
    """Writes to the client, with a deadline while it is behind. A client that stops
    reading holds its stream, and the engine slot behind it, for as long as it likes:
    backpressure keeps memory flat, but nothing else ends it (the idle timer waits on the
    engine, which waits on us). Bytes queued in user space mean the kernel's buffer to the
    client is full; then a write may wait, and waiting past `timeout_s` raises TimeoutError.
    Otherwise no timer is armed (most writes of most streams)."""

    __slots__ = ("response", "timeout_s", "transport")

    def __init__(
        self, request: web.Request, response: web.StreamResponse, timeout_s: float | None
    ) -> None:
        self.response, self.timeout_s = response, timeout_s
        self.transport = request.transport

    def behind(self, size: int) -> bool:
        transport = self.transport
        if self.timeout_s is None or transport is None:
            return False
        return transport.get_write_buffer_size() > 0 or size >= WRITE_HIGH_WATER

    async def write(self, chunk: bytes) -> None:
        if not self.behind(len(chunk)):
            await self.response.write(chunk)
            return
        async with asyncio.timeout(self.timeout_s):
            await self.response.write(chunk)

    async def write_eof(self, last: bytes = b"") -> None:
        if not self.behind(len(last)):
            await self.response.write_eof(last)
            return
        async with asyncio.timeout(self.timeout_s):
            await self.response.write_eof(last)

    def cut_off(self) -> None:
        """Drop what is queued for the client and close its connection now."""
        self.response.force_close()
        if self.transport is not None:
            self.transport.abort()


class RelayedResponse(web.StreamResponse):
    """The answer both tiers relay. Its headers wait for the first body bytes (as
    `web.Response`'s do), so they leave in the same write: one system call and one packet
    for a whole answer or a stream's first event, where StreamResponse sends two."""

    _send_headers_immediately = False  # aiohttp's switch, pinned in requirements.lock


def forward_headers(items: Iterable[tuple[str, str]], drop: frozenset[str]) -> dict[str, str]:
    """The headers worth passing on: none in `drop`, none named in a `Connection` header
    (those are hop-by-hop too, RFC 9110 §7.6.1). One pass; a second only when a
    `Connection` header names any."""
    out: dict[str, str] = {}
    named: list[str] = []
    for key, value in items:
        lower = key.lower()
        if lower == "connection":
            named += (t.strip().lower() for t in value.split(","))
        elif lower not in drop:
            out[key] = value
    if named:
        hop = set(named)
        out = {k: v for k, v in out.items() if k.lower() not in hop}
    return out


class ResponseTally:
    """Counts what went through: bytes, SSE events, the engine's usage (read from the
    whole answer: gpuroute/relay/usage_reader.py), and, when asked (`size_text`: a stream
    someone times), an estimate of the streamed text's bytes (`content`), which grows with
    the tokens whatever number an engine packs into one event: every event of a stream is
    the same JSON around its text, so once one event shows that skeleton's size, a chunk's
    text is its size less a skeleton per event (a regex over the first chunks only; the
    hot path stays arithmetic). `on_text`, while set, is called for each chunk that adds
    text (a stream's role-only first event does not: its text is empty): how the router
    times a stream's first token. `read_usage` False: no usage is read (the global tier,
    which settles no quota and keeps no usage record: `usage` stays None)."""

    __slots__ = (
        "_looks", "bytes", "content", "engine_error", "events", "hold", "keep_up_to", "kept",
        "on_text", "reader", "skeleton",
    )  # fmt: skip
    strip: ClassVar[bool] = False  # True: what the client gets is `outgoing(chunk)`

    def __init__(self, *, size_text: bool = False, read_usage: bool = True) -> None:
        # what must land before the bytes just added reach the client (a stored Responses
        # answer: a follow-up sent on reading them must find it, on any replica)
        self.hold: Awaitable[None] | None = None
        self.bytes = 0
        self.events = 0
        self.reader = UsageReader() if read_usage else None
        self.content = 0
        self.skeleton: int | None = None  # bytes of one event less its text, once seen
        self.on_text: Callable[[], None] | None = None
        self._looks = SKELETON_LOOKS if size_text else 0
        # every chunk, for a stream that may have to be continued (gpuroute/continuation/text.py),
        # while it is no longer than `keep_up_to` bytes
        self.kept: bytearray | None = None
        self.keep_up_to = 0
        # the error event an engine ended a kept stream with: held back, the stream broken
        # (an outgoing that holds whole events catches it: gpuroute/relay/strip.py)
        self.engine_error: bytes | None = None

    def add(self, chunk: bytes) -> None:
        events = chunk.count(b"data: ")
        self.bytes += len(chunk)
        if self.kept is not None:
            if self.bytes > self.keep_up_to:
                self.kept = None  # too long to continue: nothing more is kept
            else:
                self.kept += chunk
        self.events += events
        if self.reader is not None:
            self.reader.feed(chunk)
        if self.skeleton is None:
            if not (self._looks and events):
                return
            self._looks -= 1
            self.skeleton = event_skeleton(chunk)
            if self.skeleton is None:
                return
        text = len(chunk) - events * self.skeleton
        if text > 0:
            self.content += text
            if self.on_text is not None:
                self.on_text()

    def outgoing(self, chunk: bytes) -> bytes:
        """What of `chunk` (counted as it came) the client receives (with `strip` only)."""
        return chunk

    def flush(self) -> bytes:
        """What `outgoing` held back, once the body has ended (with `strip` only)."""
        return b""

    def reported(self) -> tuple[int | None, int | None]:
        """The engine's usage: (prompt, completion) tokens, each None where it said nothing."""
        return token_counts(self.usage)

    @property
    def usage(self) -> dict | None:
        """The engine's usage object as read (its latest value of each field), or None."""
        return None if self.reader is None else self.reader.usage

    def used_tokens(
        self,
        streamed: bool,
        prompt_estimate: int,
        reported: tuple[int | None, int | None] | None = None,
    ) -> int | None:
        """What the request cost in tokens: the engine's usage (prompt, and completion if
        any) when it reported one; for a stream without it, the prompt as estimated and
        its answer at one token an event or 4 bytes of text a token, whichever is more (an
        engine may pack several tokens into an event); None when nobody can tell (a whole
        answer without usage). `reported`: `reported()`, when the caller read it already."""
        prompt, completion = self.reported() if reported is None else reported
        if prompt is not None or completion is not None:
            return (prompt if prompt is not None else prompt_estimate) + (completion or 0)
        if streamed:
            return prompt_estimate + self.estimated_output()
        return None

    def estimated_output(self) -> int:
        """A stream's output tokens without usage: one an event (less the role, finish and
        [DONE] events) or 4 bytes of text one, whichever is more."""
        return max(self.events - 3, 0, self.content // BYTES_PER_TOKEN)


def event_skeleton(chunk: bytes) -> int | None:
    """The size of an SSE event in `chunk` less its text (None: no event with text)."""
    for event in chunk.split(b"\n\n"):
        found = EVENT_TEXT.search(event)
        if found is not None:
            return len(event) + 2 - len(found.group(1))
    return None


def is_event_stream(upstream: UpstreamResponse) -> bool:
    """An SSE body (counted in events) rather than one JSON document."""
    return upstream.headers.get("content-type", "").startswith("text/event-stream")


class EngineErrorEvent(Exception):
    """The engine ended its stream with an error event (its generation failed)."""


class RelayEnd(enum.Enum):
    """How relaying one upstream body ended."""

    COMPLETE = "complete"
    CLIENT_GONE = "client_gone"
    CLIENT_TOO_SLOW = "client_too_slow"  # behind past the write deadline: cut off
    UPSTREAM_BROKE = "upstream_broke"


@dataclass(slots=True)
class Relayed:
    end: RelayEnd
    tally: ResponseTally
    streamed: bool  # an SSE body (counted in events) rather than one JSON document
    error: BaseException | None = None  # what broke the upstream body


async def relay_body(
    request: web.Request,
    response: web.StreamResponse,
    upstream: UpstreamResponse,
    *,
    first: bytes = b"",
    on_first_write: Callable[[], None] | None = None,
    broken_message: Callable[[BaseException], str],
    tally: ResponseTally | None = None,
    write_timeout_s: float | None = None,
    error_event: Callable[[str], bytes] | None = None,
    end_broken: bool = True,
) -> Relayed:
    """Relay `upstream`'s body (after `first`, bytes already read) chunk by chunk; `await
    write()` is the backpressure, bounded by `write_timeout_s` while the client is behind
    (ClientWriter). A body that breaks ends as an error the client cannot miss: an SSE
    error event on a stream, else a connection closed without the final chunk. `tally` is
    counted as the body goes (a caller may watch it live). `error_event(message)` is a
    broken stream's last event in the API's own format (default: OpenAI's, then [DONE]).
    Without `end_broken` a broken stream is left open for the caller (who may continue it
    elsewhere, or end it with `end_truncated`)."""
    tally = ResponseTally() if tally is None else tally
    streamed = is_event_stream(upstream)
    client = ClientWriter(request, response, write_timeout_s)
    tally.add(first)
    if tally.hold is not None:
        await _held(tally)
    # the whole answer is here: headers and body go in one write, with a Content-Length
    whole = not streamed and upstream.content.at_eof()
    if whole:
        response.content_length = len(first)
    try:
        await response.prepare(request)
        if tally.strip:
            first = tally.outgoing(first)
        if first and not whole:
            await client.write(first)
    except ConnectionError:
        return _client_gone(response, tally, streamed)
    except TimeoutError:
        return _too_slow(client, tally, streamed)
    if on_first_write is not None:
        on_first_write()
    if whole:
        return await end(client, tally, streamed, first)
    relaying = _relay_chunks(client, upstream, tally, streamed)
    ended = await _unless_cut(relaying, request, client, streamed, error_event)
    if ended is None:
        return await end(client, tally, streamed, tally.flush() if tally.strip else b"")
    if ended.end is RelayEnd.UPSTREAM_BROKE and end_broken:
        assert ended.error is not None
        message = broken_message(ended.error)
        await end_truncated(request, client, streamed, message, error_event)
    return ended


async def _unless_cut(
    relaying: Awaitable[Relayed | None],
    request: web.Request,
    client: ClientWriter,
    streamed: bool,
    error_event: Callable[[str], bytes] | None,
) -> Relayed | None:
    """The relay, unless the drain cuts it: a stream then ends with an error event."""
    try:
        return await relaying
    except asyncio.CancelledError as cancelled:
        if streamed and drain_cut(cancelled):
            asyncio.current_task().uncancel()  # (uncancelled to write its last event)
            message = "the server is shutting down and its drain time ran out"
            await end_truncated(request, client, streamed, message, error_event)
        raise


async def _held(tally: ResponseTally) -> None:
    hold, tally.hold = tally.hold, None
    assert hold is not None
    await hold


async def end(
    client: ClientWriter, tally: ResponseTally, streamed: bool, last: bytes = b""
) -> Relayed:
    """The body's last bytes and its end (a client gone or too slow by then: said so)."""
    try:
        await client.write_eof(last)
    except ConnectionError:
        return _client_gone(client.response, tally, streamed)
    except TimeoutError:
        return _too_slow(client, tally, streamed)
    return Relayed(RelayEnd.COMPLETE, tally, streamed)


async def _relay_chunks(
    client: ClientWriter, upstream: UpstreamResponse, tally: ResponseTally, streamed: bool
) -> Relayed | None:
    """Chunks until the body ends (None), breaks (the client's deadlines included), or
    the client leaves or falls too far behind (how it ended). An engine's error event,
    held back by the tally, breaks it (gpuroute/relay/strip.py)."""
    while tally.engine_error is None:
        try:
            chunk = await upstream.content.readany()
        except UPSTREAM_ERRORS as exc:
            return Relayed(RelayEnd.UPSTREAM_BROKE, tally, streamed, exc)
        if not chunk:
            return None
        tally.add(chunk)
        if tally.hold is not None:
            await _held(tally)
        if tally.strip:
            chunk = tally.outgoing(chunk)
            if not chunk:
                continue
        try:
            await client.write(chunk)
        except ConnectionError:
            return _client_gone(client.response, tally, streamed)
        except TimeoutError:
            return _too_slow(client, tally, streamed)
    return Relayed(RelayEnd.UPSTREAM_BROKE, tally, streamed, EngineErrorEvent())


def _too_slow(client: ClientWriter, tally: ResponseTally, streamed: bool) -> Relayed:
    client.cut_off()
    return Relayed(RelayEnd.CLIENT_TOO_SLOW, tally, streamed)


def _client_gone(response: web.StreamResponse, tally: ResponseTally, streamed: bool) -> Relayed:
    response.force_close()
    return Relayed(RelayEnd.CLIENT_GONE, tally, streamed)


def openai_stream_error(message: str) -> bytes:
    """A broken OpenAI stream's last events: an error, then [DONE]."""
    return sse_error(502, message, code="upstream_stream_error") + SSE_DONE


async def end_truncated(
    request: web.Request,
    client: ClientWriter,
    streamed: bool,
    message: str,
    error_event: Callable[[str], bytes] | None = None,
) -> None:
    """A truncated answer must never look complete."""
    if streamed:
        try:
            await client.write((error_event or openai_stream_error)(message))
            await client.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        except TimeoutError:  # behind as well: it gets the cut, not the event
            client.cut_off()
        return
    # Without the terminating chunk (the body is chunked: Content-Length is never
    # forwarded) the client sees an incomplete body, never a short complete one.
    client.response.force_close()
    if request.transport is not None:
        request.transport.close()
