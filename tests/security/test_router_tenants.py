"""Tenants and what a client controls (issue 16 items 9, 10, 14, 18; issue 30 items 2 and
7): a key's class is its maximum (the default class for keys and keyless callers that name
none), a tenant's in-flight cap that holds under concurrency, no keyless way around quotas,
bounded session keys, and client keys that never reach an engine."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from support import components
from support.live import async_wait_for, holds, router_server, scripted_backend, shared_redis
from support.redis_server import RedisServer
from support_security import KEY, RecordingEngine, chat, keys_section, secure_toml

pytestmark = pytest.mark.asyncio
JSON = {"Content-Type": "application/json"}
AUTH = {**JSON, "Authorization": f"Bearer {KEY}"}


def one_slot_router(url: str, keys: str) -> str:
    """One backend with one in-flight slot: every other request waits in the admission
    queue, in priority order, then first come first served."""
    return secure_toml(url, auth=keys).replace("\n[[backends]]", "\n[[backends]]\nmax_inflight = 1")


async def admission_order(tmp_path, keys: str, earlier: dict, later: dict) -> list[str]:
    """Hold the only slot, queue `earlier` then `later` (their headers), free the slot:
    the order in which the engine got them."""
    engine = RecordingEngine()
    engine.hold = asyncio.Event()
    async with scripted_backend(engine) as url:
        async with router_server(one_slot_router(url, keys), tmp_path) as server:
            queue = server.servable.gate.queue
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with aiohttp.ClientSession() as s:
                sent = []
                for text, extra in (("occupant", earlier), ("earlier", earlier), ("later", later)):
                    headers = {**JSON, **extra}
                    sent.append(asyncio.create_task(s.post(base, data=chat(text), headers=headers)))
                    queued = len(sent) - 1  # behind the occupant
                    await async_wait_for(
                        holds(lambda n=queued: engine.started == 1 and len(queue) == n), what=text
                    )
                engine.hold.set()
                async with asyncio.timeout(10):  # released: each answers at once
                    assert [(await task).status for task in sent] == [200, 200, 200]
    return [json.loads(body)["messages"][0]["content"] for _, _, body in engine.seen[1:]]


@pytest.mark.parametrize(
    ("keys", "asking"),
    [
        # item 9 of issue 16: a key bound to `low` asking for `high`
        (keys_section('priority = "low"'), AUTH),
        # issue 30 item 7: a key that names no class is capped at the default class ...
        (keys_section(), AUTH),
        # ... and so are keyless callers under allow_anonymous with anonymous.priority unset
        ("allow_anonymous = true\n" + keys_section(), {}),
    ],
    ids=["key-bound-low", "key-without-class", "anonymous"],
)
async def test_a_request_cannot_raise_its_key_class(tmp_path, keys: str, asking: dict) -> None:
    """Live: a request asking for `high` is not let in ahead of an earlier request of the
    class its key (or the default, `normal`) allows."""
    earlier = {**AUTH} if asking else {}
    later = {**asking, "x-gpuroute-priority": "high"}
    assert await admission_order(tmp_path, keys, earlier, later) == ["earlier", "later"]


async def test_asking_for_a_lower_class_is_always_allowed(tmp_path) -> None:
    low = {**AUTH, "x-gpuroute-priority": "low"}
    order = await admission_order(tmp_path, keys_section(), low, AUTH)
    assert order == ["later", "earlier"]  # the low one waits for the normal one


@pytest.mark.parametrize("with_redis", [False, True], ids=["local", "redis"])
async def test_the_in_flight_cap_holds_under_50_concurrent_requests(tmp_path, with_redis) -> None:
    """Issue 30 item 2: with Redis on, 12 concurrent requests on a key with max_in_flight 2
    all got 200 (the cap was checked before the quota's Redis round trip and counted after
    it). 50 at once now: exactly 2 reach the engine."""
    if with_redis:
        components.redis()
    redis = RedisServer(tmp_path) if with_redis else None
    if redis is not None:
        redis.start()
    engine = RecordingEngine()
    engine.hold = asyncio.Event()
    try:
        async with scripted_backend(engine) as url:
            extra = {"redis": shared_redis(redis.url, "share_load = false")} if redis else {}
            keys = keys_section("max_in_flight = 2\nrequests_per_minute = 100000")
            text = secure_toml(url, auth=keys, **extra)
            async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
                base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                tasks = [
                    asyncio.create_task(s.post(base, data=chat(), headers=AUTH)) for _ in range(50)
                ]
                await async_wait_for(
                    holds(lambda: engine.started + sum(t.done() for t in tasks) == 50),
                    what="every request refused or at the engine",
                )
                refused = [t.result().status for t in tasks if t.done()]
                engine.hold.set()
                async with asyncio.timeout(10):  # released: each answers at once
                    answers = [(await t).status for t in tasks]
        assert engine.started == 2 and refused == [429] * 48
        assert sorted(answers) == [200] * 2 + [429] * 48
    finally:
        if redis is not None:
            redis.stop()


async def test_keyless_callers_neither_skip_keys_nor_share_a_key_quota(tmp_path) -> None:
    """Item 10: with keys configured and auth optional, 40 keyless requests passed where
    the key allowed 30."""
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, auth=keys_section("requests_per_minute = 3"))
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with s.post(base, data=chat(), headers=JSON) as r:
                assert r.status == 401
        anonymous = "allow_anonymous = true\n[auth.anonymous]\nrequests_per_minute = 2\n"
        text = secure_toml(url, auth=anonymous + keys_section("requests_per_minute = 3"))
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            keyless = []
            for _ in range(4):
                async with s.post(base, data=chat(), headers=JSON) as r:
                    keyless.append(r.status)
            assert keyless == [200, 200, 429, 429]
            async with s.post(base, data=chat(), headers=AUTH) as r:
                assert r.status == 200  # the key's own bucket is untouched


async def test_session_ids_become_fixed_length_redis_keys(tmp_path) -> None:
    """Item 14: a 1 MB `user` field became a 1 MB Redis key."""
    components.redis()
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        async with scripted_backend(RecordingEngine()) as url:
            text = secure_toml(url, redis=shared_redis(redis.url))
            async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
                base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                huge = chat(user="u" * 1_000_000)
                async with s.post(base, data=huge, headers=JSON) as r:
                    assert r.status == 200
                client = server.servable.redis
                keys = [k async for k in client.scan_iter(match="*session*")]
        assert len(keys) == 1 and len(keys[0]) < 100
    finally:
        redis.stop()


async def test_client_keys_never_reach_engines(tmp_path) -> None:
    """Item 18: clients' API keys were forwarded to engines; the router's own engine key
    (from a file, one of the secret forms) replaces them."""
    engine = RecordingEngine()
    secret = tmp_path / "engine-key"
    secret.write_text("sk-engine-only\n")
    async with scripted_backend(engine) as url:
        top = f'engine_api_key_file = "{secret}"'
        text = secure_toml(url, top=top, auth=keys_section())
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            async with s.post(base, data=chat(), headers=AUTH) as r:
                assert r.status == 200
    headers = engine.seen[0][1]
    assert headers["Authorization"] == "Bearer sk-engine-only"
    assert KEY not in json.dumps(headers)
