"""Passthrough paths (`passthrough_paths`) are placed by the scheduler and booked in its
ledger like any request (issue 44 item 6), so concurrent ones spread by booked load instead
of piling onto the backend that looked idlest when none of them counted."""

from __future__ import annotations

import asyncio
import collections

import aiohttp
import pytest
from aiohttp import web
from support.live import MODEL, async_wait_for, holds, router_server, scripted_backend

pytestmark = pytest.mark.asyncio
PATH = "/v1/load_lora_adapter"
CONCURRENT = 8


class HeldEngine:
    """Holds every passthrough request until released, counting arrivals per engine (its
    name comes back in the answer); any other path is answered at once (health checks)."""

    def __init__(self) -> None:
        self.arrived: collections.Counter[str] = collections.Counter()
        self.release = asyncio.Event()

    def engine(self, name: str):
        async def handle(request: web.Request) -> web.Response:
            await request.read()
            if request.path == PATH:
                self.arrived[name] += 1
                await self.release.wait()
            return web.json_response({"engine": name})

        return handle


def config(urls: list[str]) -> str:
    backends = "".join(
        f'[[backends]]\nurl = "{url}"\ngpu = "H100"\nmodels = ["{MODEL}"]\n' for url in urls
    )
    return f'passthrough_paths = ["{PATH}"]\ntick_s = 0.05\n[listen]\nport = 0\n' + backends


async def test_concurrent_passthrough_requests_spread_by_booked_load(tmp_path) -> None:
    """Two equal backends, 8 passthrough requests in flight at once: each backend gets 4 (one
    either way at most), and every booking is released once they are answered."""
    held = HeldEngine()
    async with (
        scripted_backend(held.engine("a")) as a,
        scripted_backend(held.engine("b")) as b,
        router_server(config([a, b]), tmp_path) as server,
        aiohttp.ClientSession() as s,
    ):
        url = f"http://127.0.0.1:{server.port}{PATH}"

        async def passthrough() -> str:
            async with s.post(url, json={"lora_name": "x"}) as r:
                assert r.status == 200
                return (await r.json())["engine"]

        calls = [asyncio.create_task(passthrough()) for _ in range(CONCURRENT)]
        total = holds(lambda: sum(held.arrived.values()) == CONCURRENT)
        await async_wait_for(total, what=f"{CONCURRENT} passthrough requests at the engines")
        spread = dict(held.arrived)
        backends = server.servable.scheduler.backends
        booked = sorted(x.in_flight for x in backends)  # each booked where it went
        held.release.set()
        answered = collections.Counter(await asyncio.gather(*calls))
        released = holds(lambda: all(x.in_flight == 0 and x.outstanding == 0 for x in backends))
        await async_wait_for(released, what="every passthrough booking released")
    assert set(spread) == {"a", "b"}, spread
    assert all(abs(n - CONCURRENT / 2) <= 1 for n in spread.values()), spread
    assert booked == sorted(spread.values())
    assert answered == held.arrived
