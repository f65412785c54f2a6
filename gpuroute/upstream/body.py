"""What an engine's answer looks like to the relay: its headers, and its body as a stream
with backpressure (gpuroute/upstream/client.py fills them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Protocol

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
