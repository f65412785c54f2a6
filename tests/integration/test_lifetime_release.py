"""Every way a request can end releases everything booked for it (issue 31).

A live router in front of two engines that misbehave as told, clients that leave when
told, deadlines that run out, rescues and a drain, interleaved at random by hypothesis:
afterwards no lifetime is left, every backend's load is back at zero, the latency model
holds nothing, and the tenant, admission and retry counts are all zero."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import tempfile
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from gpuroute.router.attempts.exchange import Exchange
from gpuroute.router.core.lifetime import RequestLifetime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.live import MODEL, router_server, scripted_backend

from gpuroute.auth import key_digest

KEY = "sk-lifetimes"
ENGINE = ("ok", "stream", "err500", "reset", "break", "hang", "slow")
CLIENT = ("read", "leave_early", "leave_at_once", "short_deadline")


class Misbehaving:
    """Answers each request as its prompt says: at once, as a stream, with a 500, by
    resetting the connection before or during the answer, never, or late."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        how = body["messages"][0]["content"]
        if how == "err500":
            return web.json_response({"error": "engine failure"}, status=500)
        if how in ("reset", "hang"):
            if how == "reset":
                request.transport.abort()
            await asyncio.sleep(3600)  # never answers; cancelled when the router lets go
        if how == "slow":
            await asyncio.sleep(0.3)  # the engine's pace, not a synchronisation
        if how in ("ok", "slow"):
            return web.json_response(
                {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(4):
            await response.write(b'data: {"choices":[{"delta":{"content":"tok "}}]}\n\n')
            if how == "break" and i == 1:
                request.transport.abort()
                return response
            await asyncio.sleep(0.01)  # a token's time
        await response.write(b"data: [DONE]\n\n")
        return response


def config(engines: list[str]) -> str:
    backends = "".join(
        f'[[backends]]\nurl = "{url}"\ngpu = "H100"\nmodels = ["{MODEL}"]\nmax_inflight = 2\n'
        for url in engines
    )
    return (
        "tick_s = 0.05\n[listen]\nport = 0\n[admin_listen]\nport = 0\n"
        "[limits]\nfirst_byte_timeout_s = 1.0\nidle_timeout_s = 1.0\n"
        "[admission]\ndefault_timeout_s = 0.6\n[retry]\nbackoff_base_s = 0.001\n"
        f'[auth]\n[[auth.keys]]\nsha256 = "{key_digest(KEY)}"\ntenant = "t"\n'
        "max_in_flight = 6\ntokens_per_minute = 100000\n" + backends
    )


async def client(session: aiohttp.ClientSession, base: str, engine: str, how: str, delay: float):
    await asyncio.sleep(delay)  # when this client arrives, not a synchronisation
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": engine}],
        "stream": engine in ("stream", "break"),
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    if how == "short_deadline":
        headers["x-gpuroute-deadline-ms"] = "50"
    request = session.post(base + "/v1/chat/completions", json=body, headers=headers)
    if how == "leave_at_once":
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            async with asyncio.timeout(0.05):
                async with request as r:
                    await r.read()
        return
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with asyncio.timeout(5.0), request as r:
            if how == "leave_early":
                await r.content.readany()
                return
            await r.read()


async def play(plan: list[tuple[str, str, float]], lost_at: float | None) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        async with scripted_backend(Misbehaving()) as one, scripted_backend(Misbehaving()) as two:
            async with router_server(config([one, two]), Path(folder)) as server:
                app = server.servable
                if lost_at is not None:  # the first engine's host is lost: its waiters move
                    loop = asyncio.get_running_loop()
                    lost = one.split("//")[1]
                    loop.call_later(lost_at, setattr, app.watch, "lost", lambda b: b == lost)
                base = f"http://127.0.0.1:{server.port}"
                async with aiohttp.ClientSession() as session:
                    await asyncio.gather(*(client(session, base, *step) for step in plan))
                await server.drain(timeout=0.5)  # cuts whatever still hangs
            return books(app)


def books(app) -> dict:
    """Everything that counts requests in flight, anywhere in the router."""
    latency = app.scheduler.latency
    loads = [latency._load.get(b.backend_id) for b in app.scheduler.backends]
    return {
        "lifetimes": len(app.lifetimes),
        "in_flight": [b.in_flight for b in app.scheduler.backends],
        "outstanding": [round(b.outstanding, 9) for b in app.scheduler.backends],
        "ledger": len(app.scheduler.ledger),
        "latency_kv": [round(s.kv_tokens, 6) for s in loads if s is not None],
        "protected": latency.protected_streams,
        "budget": (app.lifetimes.budget.active, app.lifetimes.budget.active_retries),
        "tenants": dict(app.proxy.front.tenants.in_flight),
        "admitted": app.gate.slots.admitted,
        "queued": (len(app.gate.queue), len(app.slo.queue)),
        "handlers": app.proxy.active,
    }


RELEASED = {
    "lifetimes": 0, "in_flight": [0, 0], "outstanding": [0.0, 0.0], "ledger": 0,
    "protected": 0, "budget": (0, 0), "tenants": {}, "admitted": 0, "queued": (0, 0),
    "handlers": 0,
}  # fmt: skip

steps = st.tuples(st.sampled_from(ENGINE), st.sampled_from(CLIENT), st.floats(0, 0.3))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)
@given(plan=st.lists(steps, min_size=1, max_size=10), lost_at=st.none() | st.floats(0, 0.4))
def test_every_ending_releases_everything_booked(plan, lost_at) -> None:
    left = asyncio.run(play(plan, lost_at))
    kv = left.pop("latency_kv")
    assert left == RELEASED, (plan, lost_at)
    assert all(k == 0 for k in kv), (plan, kv)


async def garbage_after(engine: str, count: int) -> collections.Counter:
    """The router's request objects among what the collector alone could free once `count`
    requests that the engine answers as `engine` have ended."""
    watched = (web.BaseRequest, Exchange, RequestLifetime)
    with tempfile.TemporaryDirectory() as folder:
        async with scripted_backend(Misbehaving()) as one:
            async with router_server(config([one]), Path(folder)) as server:
                base = f"http://127.0.0.1:{server.port}"
                async with aiohttp.ClientSession() as session:
                    await client(session, base, engine, "read", 0.0)  # warm: first-use caches
                    gc.collect()
                    gc.set_debug(gc.DEBUG_SAVEALL)
                    try:
                        for _ in range(count):
                            await client(session, base, engine, "read", 0.0)
                        gc.collect()
                        return collections.Counter(
                            type(o).__name__ for o in gc.garbage if isinstance(o, watched)
                        )
                    finally:
                        gc.set_debug(0)
                        gc.garbage.clear()


@pytest.mark.parametrize("engine", ["ok", "stream", "err500"])
def test_an_ended_request_leaves_no_reference_cycle(engine: str) -> None:
    """Reference counting frees a request as it ends: one left in a cycle waits for the
    collector, and under load that was a gen-1 collection every 20 or so requests and gen-2
    pauses in the router's p99 (the access line's exchange, parked on the aiohttp request
    that it holds)."""
    assert asyncio.run(garbage_after(engine, 20)) == collections.Counter()
