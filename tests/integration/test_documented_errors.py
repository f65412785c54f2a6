"""Answers docs/operations.md promises ("What clients see when things go wrong") that only
a live router gives: a queued request whose deadline passes, and a router bug."""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp
import pytest
from aiohttp import web
from support.live import (
    MODEL,
    async_wait_for,
    chat_body,
    holds,
    router_toml,
    running_router,
    scripted_backend,
)

pytestmark = pytest.mark.asyncio
ANSWER = {"id": "x", "object": "chat.completion", "choices": [], "usage": {"completion_tokens": 1}}


class HeldEngine:
    """Answers once `release` is set; counts the requests that reached it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def __call__(self, request: web.Request) -> web.Response:
        await request.read()
        self.started += 1
        await self.release.wait()
        return web.json_response(ANSWER)


def books(router) -> dict:
    """What a request books in the router, all of it released once it ended."""
    return {
        "lifetimes": len(router.lifetimes),
        "ledger": len(router.scheduler.ledger),
        "in_flight": [b.in_flight for b in router.scheduler.backends],
        "admitted": router.gate.slots.admitted,
        "queued": len(router.gate.queue),
        "handlers": router.proxy.active,
    }


RELEASED = {"lifetimes": 0, "ledger": 0, "in_flight": [0], "admitted": 0, "queued": 0,
            "handlers": 0}  # fmt: skip


async def test_a_queued_request_whose_deadline_passes_gets_504(tmp_path) -> None:
    """One in-flight slot, held by an occupant: a request with a 100 ms queueing deadline
    waits, then gets 504 `deadline_exceeded` with Retry-After, and never reaches the engine."""
    engine = HeldEngine()
    async with scripted_backend(engine) as url:
        config = router_toml([(url, "H100")]).replace(
            'models = ["llama-3.1-8b"]', 'models = ["llama-3.1-8b"]\nmax_inflight = 1'
        )
        async with running_router(config, tmp_path) as (base, router), aiohttp.ClientSession() as s:
            post = base + "/v1/chat/completions"
            occupant = asyncio.create_task(s.post(post, json=chat_body()))
            await async_wait_for(holds(lambda: engine.started == 1), what="the occupant")
            late = {"x-gpuroute-deadline-ms": "100"}
            async with asyncio.timeout(10), s.post(post, json=chat_body(), headers=late) as r:
                answer = (r.status, r.headers.get("Retry-After"), await r.json())
            assert answer == (504, "1", {"error": {
                "message": "deadline passed while queued",
                "type": "timeout_error", "param": None, "code": "deadline_exceeded",
            }})  # fmt: skip
            shed = router.metrics.registry.get_sample_value(
                "gpuroute_shed_total", {"reason": "deadline"}
            )
            assert (shed, engine.started) == (1.0, 1)
            engine.release.set()
            async with await asyncio.wait_for(occupant, 10) as r:
                assert r.status == 200
            await async_wait_for(holds(lambda: books(router) == RELEASED), what="releases")


class FailsOnce(random.Random):
    """Placement's random draw raises once: a bug in the router, as a handler meets one."""

    def __init__(self) -> None:
        super().__init__(0)
        self.armed = True

    def randrange(self, *args, **kwargs) -> int:
        if self.armed:
            self.armed = False
            raise RuntimeError("injected placement bug")
        return super().randrange(*args, **kwargs)


async def test_a_router_bug_answers_500_internal_error_and_logs_the_traceback(
    tmp_path, caplog
) -> None:
    """The handler answers a bug in OpenAI's format (never aiohttp's bare 500), logs the
    traceback, releases what the request booked, and the router serves the next one."""
    engine = HeldEngine()
    engine.release.set()
    rng = FailsOnce()
    async with scripted_backend(engine) as url:
        config = router_toml([(url, "H100")], policy="random")
        async with running_router(config, tmp_path, rng=rng) as (base, router):
            async with aiohttp.ClientSession() as s:
                post = base + "/v1/chat/completions"
                with caplog.at_level(logging.ERROR, logger="gpuroute"):
                    async with s.post(post, json=chat_body()) as r:
                        answer = (r.status, await r.json())
                assert answer == (500, {"error": {
                    "message": "internal router error",
                    "type": "server_error", "param": None, "code": "internal_error",
                }})  # fmt: skip
                assert (rng.armed, engine.started) == (False, 0)
                logged = [rec for rec in caplog.records if rec.exc_info is not None]
                assert [str(rec.exc_info[1]) for rec in logged] == ["injected placement bug"]
                assert books(router) == RELEASED
                async with s.post(post, json=chat_body()) as r:
                    assert (r.status, engine.started) == (200, 1)
                counted = router.metrics.registry.get_sample_value
                route = {"route": "/v1/chat/completions", "model": MODEL}
                assert counted("gpuroute_requests_total", route | {"code": "500"}) == 1.0
