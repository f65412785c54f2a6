"""Writing an answer to its client, with a deadline only while the client is behind."""

from __future__ import annotations

import asyncio

from aiohttp import web

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
