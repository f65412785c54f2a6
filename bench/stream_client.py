"""The load generator of `bench stream`: many SSE streams on raw asyncio connections, each
event timestamped as it arrives (no HTTP client library between the socket and the clock).

A read that brings several events gives the first the gap since the last read and the
others a gap of zero: that is what a client of the proxy sees."""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from dataclasses import dataclass, field

EVENT = b"data: {"  # a JSON event (token or finish); the closing [DONE] is not counted
DONE = b"data: [DONE]"


@dataclass
class StreamsResult:
    streams: int
    completed: int = 0
    failed: int = 0
    events: int = 0
    ttft_s: array = field(default_factory=lambda: array("d"))
    gaps_s: array = field(default_factory=lambda: array("d"))
    started: float = 0.0
    ended: float = 0.0


class _Stream(asyncio.Protocol):
    def __init__(self, request: bytes, result: StreamsResult, done: asyncio.Future) -> None:
        self.request, self.result, self.done = request, result, done
        self.sent = self.last = 0.0
        self.tail, self.head, self.events = b"", b"", 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.sent = time.perf_counter()
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if len(self.head) < 12:
            self.head += data[:12]
        buf = self.tail + data
        n = buf.count(EVENT)
        if n:
            if self.events == 0:
                self.result.ttft_s.append(now - self.sent)
            else:
                self.result.gaps_s.append(now - self.last)
            self.result.gaps_s.extend([0.0] * (n - 1))
            self.events += n
            self.last = now
        self.tail = buf[-(len(EVENT) - 1) :]
        if DONE in buf:
            self._finish(self.head.startswith(b"HTTP/1.1 200"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(False)

    def _finish(self, ok: bool) -> None:
        if self.done.done():
            return
        self.result.events += self.events
        if ok:
            self.result.completed += 1
        else:
            self.result.failed += 1
        self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()


def stream_request(port: int, model: str, tokens: int) -> bytes:
    body = (
        f'{{"model": "{model}", "prompt": "hi", "max_tokens": {tokens}, "stream": true}}'
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def run_streams(
    port: int, streams: int, tokens: int, spread_s: float, timeout_s: float, model: str
) -> StreamsResult:
    """`streams` streams of `tokens` tokens, their starts spread evenly over `spread_s` (a
    fleet's streams are not in phase), all on their own connection."""
    loop = asyncio.get_running_loop()
    result = StreamsResult(streams)
    request = stream_request(port, model, tokens)
    result.started = time.perf_counter()

    async def one(delay: float) -> None:
        await asyncio.sleep(delay)  # the stream's start in the spread, not a synchronisation
        done = loop.create_future()
        try:
            await loop.create_connection(lambda: _Stream(request, result, done), "127.0.0.1", port)
        except OSError:
            result.failed += 1
            return
        await done

    jobs = [one(spread_s * i / streams) for i in range(streams)]
    with contextlib.suppress(TimeoutError):  # unfinished streams count as failed below
        await asyncio.wait_for(asyncio.gather(*jobs), timeout_s)
    result.ended = time.perf_counter()
    result.failed = streams - result.completed
    return result
