"""Quotas across replicas through a real redis-server; the local fallback when it is gone."""

from __future__ import annotations

import asyncio
import time

import pytest
from gpuroute.router.shared.quotas import AuthError, KeyPolicy, Quotas, key_digest
from support.live import async_wait_for
from support.redis_server import SHARED_STATE_TIMEOUT_S, client

from gpuroute.auth import bearer

pytestmark = pytest.mark.asyncio
KEY = "sk-test-123"


def replicas(url: str | None, n: int, rpm: float, **kw) -> list[Quotas]:
    """`n` replicas' quotas, each with its own Redis client (as each router has)."""
    keys = {key_digest(KEY): KeyPolicy("acme", requests_per_minute=rpm)}
    timeout_s = kw.get("timeout_s", SHARED_STATE_TIMEOUT_S)
    return [Quotas(keys, required=True, redis=client(url, timeout_s), **kw) for _ in range(n)]


async def closed(quotas: Quotas) -> None:
    if quotas.redis is not None:
        await quotas.redis.aclose()


async def test_four_replicas_share_one_quota_within_5_percent(redis) -> None:
    rpm = 6000.0  # 100 requests/s
    # what is measured is the sharing, not the fallback: a Redis call is given a second
    # (at the default 50 ms a busy CI machine sometimes fell back to local buckets)
    quotas = replicas(redis.url, 4, rpm, timeout_s=1.0)
    policy = quotas[0].identify({"authorization": f"Bearer {KEY}"})
    try:
        for _ in range(100_000):  # spend the minute's burst (and what refills meanwhile)
            if not (await quotas[0].charge(policy, 0)).allowed:
                break
        else:
            pytest.fail("the shared burst never ran out")
        granted, started = 0, time.monotonic()
        while time.monotonic() - started < 3.0:
            results = await asyncio.gather(*(q.charge(policy, 0) for q in quotas))
            granted += sum(r.allowed for r in results)
            assert all(r.shared for r in results)
        elapsed = time.monotonic() - started
    finally:
        for q in quotas:
            await closed(q)
    expected = rpm / 60 * elapsed
    print(f"\n4 replicas: {granted} granted in {elapsed:.2f} s, quota allows {expected:.0f}")
    assert abs(granted - expected) <= 0.05 * expected


async def test_refusal_carries_retry_after_and_rate_limit_headers(redis) -> None:
    [q] = replicas(redis.url, 1, 2.0)
    policy = q.identify({"authorization": f"Bearer {KEY}"})
    try:
        assert (await q.charge(policy, 0)).allowed and (await q.charge(policy, 0)).allowed
        refused = await q.charge(policy, 0)
    finally:
        await closed(q)
    assert not refused.allowed and refused.limit == "requests"
    assert 25 <= refused.retry_after_s <= 30  # 2/min: the next token in ~30 s
    assert refused.headers["Retry-After"] == str(int(refused.retry_after_s + 0.999))
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


async def test_redis_gone_falls_back_to_local_buckets_and_comes_back(redis) -> None:
    modes: list[bool] = []
    [q] = replicas(redis.url, 1, 600.0, local_fraction=0.25, retry_s=0.2, on_mode=modes.append)
    policy = q.identify({"authorization": f"Bearer {KEY}"})
    try:
        assert (await q.charge(policy, 0)).shared
        redis.stop()
        verdicts = [await q.charge(policy, 0) for _ in range(200)]
        assert not any(v.shared for v in verdicts)
        # a quarter of what the shared bucket had left (599 of 600), not of a full one
        assert sum(v.allowed for v in verdicts) == 149
        redis.start()

        async def shared_again() -> bool:
            return (await q.charge(policy, 0)).shared

        await async_wait_for(shared_again, 5, "the quotas back on Redis")
    finally:
        await closed(q)
    assert modes[:2] == [False, True]


async def test_keys_are_checked() -> None:
    [q] = replicas(None, 1, 60.0)
    assert q.identify({"authorization": f"Bearer {KEY}"}).tenant == "acme"
    for header, message in (
        (None, "missing API key"),
        ("Bearer", "malformed"),
        ("Basic abc", "malformed"),
        ("Bearer a b", "malformed"),
        ("Bearer " + "x" * 600, "malformed"),
        ("Bearer sk-other", "invalid API key"),
    ):
        with pytest.raises(AuthError, match=message):
            q.identify({"authorization": header})
    assert bearer(" Bearer  sk-1 ") == "sk-1"
    await closed(q)


async def test_router_answers_401_and_429_in_openai_format_and_survives_redis_loss(
    redis, tmp_path
) -> None:
    import aiohttp
    from aiohttp import web
    from support.live import chat_body, router_toml, running_router, scripted_backend, shared_redis

    async def engine(request: web.Request) -> web.Response:
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [],
                                  "usage": {"completion_tokens": 1}})  # fmt: skip

    async with scripted_backend(engine) as url:
        text = router_toml(
            [(url, "H100")],
            auth=f'required = true\n[[auth.keys]]\nsha256 = "{key_digest(KEY)}"\n'
            'tenant = "acme"\nrequests_per_minute = 3',
            redis=shared_redis(redis.url, "retry_s = 0.2\nlocal_fraction = 1.0"),
        )
        async with running_router(text, tmp_path) as (router_url, router):
            async with aiohttp.ClientSession() as s:
                post = router_url + "/v1/chat/completions"
                for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "x"}):
                    async with s.post(post, json=chat_body(), headers=headers) as r:
                        body = await r.json()
                        assert r.status == 401 and body["error"]["code"] == "invalid_api_key"
                auth = {"Authorization": f"Bearer {KEY}"}
                statuses = []
                for _ in range(4):
                    async with s.post(post, json=chat_body(), headers=auth) as r:
                        statuses.append(r.status)
                        last = (r.headers.copy(), await r.json())
                assert statuses == [200, 200, 200, 429]
                assert last[1]["error"]["code"] == "rate_limit_exceeded"
                assert int(last[0]["Retry-After"]) >= 1
                assert last[0]["x-ratelimit-remaining-requests"] == "0"
                redis.stop()  # Redis gone: the local bucket starts where the shared one was
                async with s.post(post, json=chat_body(), headers=auth) as r:
                    assert r.status == 429  # spent before the outage, still spent (no 5xx)
                metrics = router.metrics.registry.get_sample_value("gpuroute_quota_shared")
                assert metrics == 0.0


async def test_follow_up_turns_reach_the_same_backend_through_any_replica(redis, tmp_path) -> None:
    import aiohttp
    from aiohttp import web
    from support.live import (
        chat_body,
        router_toml,
        running_router,
        scripted_backend,
        shared_redis,
    )

    async def engine(request: web.Request) -> web.Response:
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [],
                                  "usage": {"completion_tokens": 1}})  # fmt: skip

    async with scripted_backend(engine) as u1, scripted_backend(engine) as u2:
        async with scripted_backend(engine) as u3:
            text = router_toml(
                [(u1, "H100"), (u2, "H100"), (u3, "H100")], redis=shared_redis(redis.url)
            )
            (tmp_path / "a").mkdir()
            (tmp_path / "b").mkdir()
            async with running_router(text, tmp_path / "a", seed=1) as (ra, _):
                async with running_router(text, tmp_path / "b", seed=2) as (rb, _):
                    async with aiohttp.ClientSession() as s:
                        served = {}
                        for session in ("s1", "s2", "s3", "s4"):
                            for turn in range(6):
                                url = (ra, rb)[turn % 2] + "/v1/chat/completions"
                                headers = {"x-session-id": session}
                                async with s.post(url, json=chat_body(), headers=headers) as r:
                                    assert r.status == 200
                                    served.setdefault(session, set()).add(
                                        r.headers["x-gpuroute-backend"]
                                    )
    assert all(len(backends) == 1 for backends in served.values()), served


async def test_key_bound_elsewhere_gets_403_and_oversized_headers_get_400_bad_request(
    tmp_path,
) -> None:
    """The regional router enforces a key's residency set whatever sent the request there,
    and headers beyond the server's limits are refused with 400 `bad_request` in OpenAI's
    error format."""
    import aiohttp
    from aiohttp import web
    from support.live import chat_body, router_toml, running_router, scripted_backend

    async def engine(request: web.Request) -> web.Response:
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [],
                                  "usage": {"completion_tokens": 1}})  # fmt: skip

    eu_key, us_key = "sk-eu-1", "sk-us-1"
    async with scripted_backend(engine) as url:
        text = router_toml(
            [(url, "H100")],
            region='name = "eu-west"\njurisdiction = "eu"',
            auth=f'required = true\n[[auth.keys]]\nsha256 = "{key_digest(eu_key)}"\n'
            'tenant = "acme-eu"\nresidency = ["eu"]\n'
            f'[[auth.keys]]\nsha256 = "{key_digest(us_key)}"\ntenant = "acme-us"\n'
            'residency = ["us", "us-east"]',
        )
        async with running_router(text, tmp_path) as (router_url, router):
            post = router_url + "/v1/chat/completions"
            async with aiohttp.ClientSession() as s:
                eu, us = ({"Authorization": f"Bearer {k}"} for k in (eu_key, us_key))
                async with s.post(post, json=chat_body(), headers=eu) as r:
                    assert r.status == 200
                async with s.post(post, json=chat_body(), headers=us) as r:
                    body = await r.json()
                    assert r.status == 403
                    assert body["error"]["code"] == "residency_violation"
                    assert "us, us-east" in body["error"]["message"]
                    assert "eu, eu-west" in body["error"]["message"]
                refusals = router.metrics.registry.get_sample_value(
                    "gpuroute_residency_refusals_total", {"tenant": "acme-us"}
                )
                assert refusals == 1.0
                # aiohttp's limits (docs/operations.md): a line over 8,190 bytes, 128 headers
                for headers, why in (
                    (eu | {"x-big": "a" * 20_000},
                     "a request or header line is longer than 8190 bytes"),
                    (eu | {f"x-h{i}": "v" for i in range(200)}, "Too many headers received"),
                ):  # fmt: skip
                    async with s.post(post, json=chat_body(), headers=headers) as r:
                        assert (r.status, await r.json()) == (400, {"error": {
                            "message": f"malformed HTTP request: {why}",
                            "type": "invalid_request_error", "param": None, "code": "bad_request",
                        }})  # fmt: skip
