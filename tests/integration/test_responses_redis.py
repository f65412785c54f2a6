"""Stored responses in a real redis-server: the put script's bounds per tenant (the oldest
evicted first), its TTL, deletion, and a Redis outage falling back to this process."""

from __future__ import annotations

import asyncio

import pytest
from gpuroute.router.config.responses import ResponsesConfig
from gpuroute.router.responses.redis_store import RedisResponses
from gpuroute.router.responses.store import ResponsesStore, StoredResponse, StoreUnavailable
from support.redis_server import client

pytestmark = pytest.mark.asyncio


def entry(rid: str, tenant: str = "acme") -> StoredResponse:
    return StoredResponse({"id": rid, "object": "response", "output": []}, [], tenant, 0.0)


async def test_the_put_script_evicts_the_oldest_past_count_and_bytes(redis) -> None:
    r = client(redis.url, 1.0)
    store = RedisResponses(r, prefix="t", ttl_s=60, max_count=3, max_bytes=100)
    try:
        for rid in ("resp_1", "resp_2", "resp_3"):
            assert await store.put("acme", rid, b"x" * 10) == 0
            await asyncio.sleep(0.003)  # stored in distinct milliseconds
        assert await store.put("globex", "resp_1", b"g" * 10) == 0  # its own bounds
        assert await store.put("acme", "resp_4", b"x" * 10) == 1  # resp_1 goes
        assert await store.get("acme", "resp_1") is None
        assert await store.get("globex", "resp_1") == b"g" * 10
        await asyncio.sleep(0.003)
        assert await store.put("acme", "resp_5", b"y" * 85) == 2  # 105 bytes: two more go
        assert [await store.get("acme", f"resp_{i}") is not None for i in (2, 3, 4, 5)] == [
            False, False, True, True
        ]  # fmt: skip
        assert int(await r.hget("t:responses-bytes:acme", "#total")) == 95
        assert await store.delete("acme", "resp_4") and not await store.delete("acme", "resp_4")
        assert int(await r.hget("t:responses-bytes:acme", "#total")) == 85
        assert await r.pttl("t:responses:acme:resp_5") > 59_000
    finally:
        await r.aclose()


async def test_entries_expire_after_the_ttl(redis) -> None:
    r = client(redis.url, 1.0)
    store = RedisResponses(r, prefix="t", ttl_s=0.2)
    try:
        await store.put("acme", "resp_1", b"x")
        assert await store.get("acme", "resp_1") == b"x"
        await asyncio.sleep(0.3)
        assert await store.get("acme", "resp_1") is None
        await store.put("acme", "resp_2", b"y")  # the expired id is pruned from the index
        assert await r.zrange("t:responses:acme", 0, -1) == [b"resp_2"]
    finally:
        await r.aclose()


async def test_redis_gone_stores_here_and_reads_back_then_shares_again(redis) -> None:
    r = client(redis.url, 0.2)
    config = ResponsesConfig()
    store = ResponsesStore(config, RedisResponses(r), retry_s=0.2)
    try:
        assert await store.put(entry("resp_shared"))
        redis.stop()
        assert await store.put(entry("resp_local"))  # kept in this process
        assert (await store.get("acme", "resp_local")).id == "resp_local"
        with pytest.raises(StoreUnavailable):  # in Redis, which cannot answer: not a 404
            await store.get("acme", "resp_shared")
        redis.start()
        await asyncio.sleep(0.25)
        assert await store.get("acme", "resp_shared") is None  # a fresh redis-server: empty
        assert (await store.get("acme", "resp_local")).id == "resp_local"
    finally:
        await r.aclose()
