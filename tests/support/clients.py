"""Closed-loop clients for the tests that break a fleet and count what the clients saw."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from gpuroute.router.attempts.exchange import BACKEND_HEADER

from support.live import chat_body


class Clients:
    """`workers` clients sending requests back to back; every outcome is recorded."""

    def __init__(self, url: str, workers: int, *, stream: bool = False, max_tokens: int = 8):
        self.url, self.workers, self.stream, self.max_tokens = url, workers, stream, max_tokens
        self.results: list[tuple[float, str | None, int, bool]] = []  # sent, backend, status, ok
        self.open: dict[str, int] = {}  # answers under way (head read, body not) per backend
        self.stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> Clients:
        self.session = aiohttp.ClientSession()
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.workers)]
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks)
        await self.session.close()

    async def _worker(self) -> None:
        body = chat_body(stream=self.stream, max_tokens=self.max_tokens)
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                async with self.session.post(self.url + "/v1/chat/completions", json=body) as r:
                    text = await self._read(r)
                    ok = r.status == 200 and (not self.stream or "data: [DONE]" in text)
                    ok = ok and '"error"' not in text
                    self.results.append((sent, r.headers.get(BACKEND_HEADER), r.status, ok))
            except aiohttp.ClientError:
                self.results.append((sent, None, 0, False))

    async def _read(self, response: aiohttp.ClientResponse) -> str:
        """The body, counted in `open` under its backend while it arrives."""
        backend = response.headers.get(BACKEND_HEADER) or ""
        self.open[backend] = self.open.get(backend, 0) + 1
        try:
            return await response.text()
        finally:
            self.open[backend] -= 1

    @property
    def failed(self) -> list[tuple[float, str | None, int, bool]]:
        return [r for r in self.results if not r[3]]

    def first_to(self, backend: str, after: float = 0.0) -> float | None:
        return min((r[0] for r in self.results if r[1] == backend and r[0] > after), default=None)
