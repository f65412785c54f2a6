"""Tenants and what a client controls (issue 16 items 9, 10, 14, 18): a key's class is its
maximum, a tenant's in-flight cap, no keyless way around quotas, bounded session keys, and
client keys that never reach an engine."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.metrics import RouterMetrics
from gpuroute.router.quotas import KeyPolicy, Quotas
from gpuroute.router.tenant_gate import TenantGate
from support.live import MODEL, router_server, scripted_backend
from support.redis_server import RedisServer, redis_binary
from support_security import KEY, RecordingEngine, chat, keys_section, secure_toml

pytestmark = pytest.mark.asyncio
JSON = {"Content-Type": "application/json"}
AUTH = {**JSON, "Authorization": f"Bearer {KEY}"}


async def test_a_request_cannot_raise_its_key_class() -> None:
    """Item 9: `x-gpuroute-priority: high` overrode a key bound to `low`."""
    gate = TenantGate(
        Quotas({}, required=False, redis=None), RouterMetrics(), ("high", "normal", "low")
    )
    low_key = KeyPolicy("batch-tenant", priority="low")
    asked_high = RequestInfo(1, MODEL, 10, priority="high")
    await gate.charge(low_key, asked_high, explicit_priority=True)
    assert asked_high.priority == "low"
    normal_key = KeyPolicy("web", priority="normal")
    asked_low = RequestInfo(2, MODEL, 10, priority="low")
    await gate.charge(normal_key, asked_low, explicit_priority=True)
    assert asked_low.priority == "low"  # asking for less is always allowed


async def test_tenant_in_flight_cap(tmp_path) -> None:
    engine = RecordingEngine()
    engine.hold = asyncio.Event()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, auth=keys_section("max_in_flight = 2"))
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            held = [asyncio.create_task(s.post(base, data=chat(), headers=AUTH)) for _ in range(2)]
            while engine.started < 2:
                await asyncio.sleep(0.01)
            async with s.post(base, data=chat(), headers=AUTH) as r:
                assert r.status == 429
                assert (await r.json())["error"]["code"] == "concurrency_limit_exceeded"
            engine.hold.set()
            for task in held:
                assert (await task).status == 200
            async with s.post(base, data=chat(), headers=AUTH) as r:
                assert r.status == 200


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


@pytest.mark.skipif(redis_binary() is None, reason="redis-server not installed")
async def test_session_ids_become_fixed_length_redis_keys(tmp_path) -> None:
    """Item 14: a 1 MB `user` field became a 1 MB Redis key."""
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        async with scripted_backend(RecordingEngine()) as url:
            text = secure_toml(url, redis=f'url = "{redis.url}"')
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
