"""What a client's own control headers may do (issue 30 items 8 and 12): a deadline may
only shorten the router's own (`x-gpuroute-deadline-ms: 1e400` was taken as infinite, and
the request waited 46 s where the default is 30 s), and no header is echoed whole in an
error (8,000-character priority and residency values came back in full)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from support.global_tier import global_tier
from support.live import async_wait_for, holds, router_server, scripted_backend
from support_security import RecordingEngine, chat, secure_toml

pytestmark = pytest.mark.asyncio
JSON = {"Content-Type": "application/json"}


async def refusals(tmp_path, headers: list[dict]) -> list[tuple[int, str]]:
    """(status, error message) for a request with each of these headers at a router; no
    request may reach the engine."""
    engine = RecordingEngine()
    answers = []
    async with scripted_backend(engine) as url:
        async with (
            router_server(secure_toml(url), tmp_path) as server,
            aiohttp.ClientSession() as s,
        ):
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            for extra in headers:
                async with s.post(base, data=chat(), headers={**JSON, **extra}) as r:
                    answers.append((r.status, (await r.json())["error"]["message"]))
    assert engine.seen == []
    return answers


@pytest.mark.parametrize("deadline", ["1e400", "inf", "nan", "-5", "0", "soon"])
async def test_a_deadline_that_is_no_finite_positive_number_is_refused(tmp_path, deadline) -> None:
    [(status, message)] = await refusals(tmp_path, [{"x-gpuroute-deadline-ms": deadline}])
    assert status == 400 and "finite" in message, message


async def test_a_deadline_header_only_shortens_the_routers_own(tmp_path) -> None:
    """The only slot is held; a request asking to wait 11 days is shed at the router's
    default queueing deadline (0.5 s here), and one asking for less at its own."""
    engine = RecordingEngine()
    engine.hold = asyncio.Event()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, admission="default_timeout_s = 0.5").replace(
            "\n[[backends]]", "\n[[backends]]\nmax_inflight = 1"
        )
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            occupant = asyncio.create_task(s.post(base, data=chat(), headers=JSON))
            await async_wait_for(holds(lambda: engine.started == 1), what="the occupant")
            waits = {}
            for deadline_ms in ("1e9", "200"):
                started = time.monotonic()
                headers = {**JSON, "x-gpuroute-deadline-ms": deadline_ms}
                async with s.post(base, data=chat(), headers=headers) as r:
                    assert (
                        r.status == 504 and (await r.json())["error"]["code"] == "deadline_exceeded"
                    )
                waits[deadline_ms] = time.monotonic() - started
            engine.hold.set()
            assert (await occupant).status == 200
    assert waits["1e9"] < 5.0 and waits["200"] < waits["1e9"], waits


async def test_long_header_values_are_never_echoed_whole(tmp_path) -> None:
    long = "h" * 8000
    names = ("x-gpuroute-priority", "x-gpuroute-slo")
    for status, message in await refusals(tmp_path, [{name: long} for name in names]):
        assert status == 400 and len(message) < 300, len(message)
    async with scripted_backend(RecordingEngine()) as url:
        async with global_tier(tmp_path, url) as (front, _app), aiohttp.ClientSession() as s:
            headers = {**JSON, "x-gpuroute-residency": long}
            async with s.post(f"{front}/v1/chat/completions", data=chat(), headers=headers) as r:
                message = (await r.json())["error"]["message"]
            assert r.status == 400 and len(message) < 300, len(message)
