"""The Responses API's store: TTL on an injected clock, the per-tenant bounds (count and
bytes) evicting the oldest first, tenants kept apart, and Redis trouble falling back to
this process without a false 404."""

from __future__ import annotations

import pytest
from gpuroute.router.config.responses import ResponsesConfig
from gpuroute.router.responses.store import (
    MemoryStore,
    ResponsesStore,
    StoredResponse,
    StoreUnavailable,
    tenant_key,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def config(**kw) -> ResponsesConfig:
    return ResponsesConfig(**({"ttl_s": 60.0, "max_per_tenant": 3} | kw))


def entry(rid: str, tenant: str = "acme", text: str = "hi") -> StoredResponse:
    response = {"id": rid, "object": "response", "status": "completed", "output": []}
    return StoredResponse(response, [{"role": "user", "content": text}], tenant, 0.0)


def test_an_entry_expires_after_its_ttl() -> None:
    clock = Clock()
    store = MemoryStore(config(), clock)
    store.put("t", "resp_a", b"a")
    clock.now += 59.9
    assert store.get("t", "resp_a") == b"a"
    clock.now += 0.2
    assert store.get("t", "resp_a") is None
    assert store.sizes == {} and store.tenants == {}  # nothing left behind


def test_the_oldest_is_evicted_past_the_count_and_a_rewrite_counts_as_new() -> None:
    store = MemoryStore(config(), Clock())
    for rid in ("resp_1", "resp_2", "resp_3"):
        store.put("t", rid, b"x")
    store.put("t", "resp_1", b"y")  # stored again: now the newest
    store.put("t", "resp_4", b"x")
    assert list(store.tenants["t"]) == ["resp_3", "resp_1", "resp_4"]
    assert store.get("t", "resp_2") is None and store.get("t", "resp_1") == b"y"


def test_the_oldest_are_evicted_past_the_bytes_and_other_tenants_keep_theirs() -> None:
    bounds = config(max_per_tenant=100, max_bytes_per_tenant=2048, max_entry_bytes=1024)
    store = MemoryStore(bounds, Clock())
    store.put("other", "resp_o", b"o" * 2000)
    store.put("t", "resp_1", b"1" * 1000)
    store.put("t", "resp_2", b"2" * 1000)
    store.put("t", "resp_3", b"3" * 100)  # 2100 > 2048: resp_1 goes
    assert list(store.tenants["t"]) == ["resp_2", "resp_3"] and store.sizes["t"] == 1100
    assert store.get("other", "resp_o") == b"o" * 2000


def test_expired_entries_go_before_any_live_one_is_evicted() -> None:
    clock = Clock()
    store = MemoryStore(config(), clock)
    store.put("t", "resp_old", b"x")
    clock.now += 30
    store.put("t", "resp_a", b"x")
    store.put("t", "resp_b", b"x")
    clock.now += 31  # resp_old expired
    store.put("t", "resp_c", b"x")
    assert list(store.tenants["t"]) == ["resp_a", "resp_b", "resp_c"]


@pytest.mark.asyncio
async def test_a_tenant_reads_only_its_own_and_foreign_ids_are_unknown() -> None:
    store = ResponsesStore(config())
    assert await store.put(entry("resp_a", "acme"))
    assert (await store.get("acme", "resp_a")).conversation()[0]["content"] == "hi"
    assert await store.get("globex", "resp_a") is None  # another tenant: as unknown
    assert not await store.delete("globex", "resp_a")
    assert await store.get("acme", "resp_a") is not None
    for rid in ("../x", "resp a", "x" * 129, ""):
        assert await store.get("acme", rid) is None
    assert not await store.put(entry("resp:evil"))  # no id an engine gives: never a key
    assert await store.delete("acme", "resp_a")
    assert await store.get("acme", "resp_a") is None


@pytest.mark.asyncio
async def test_an_entry_over_max_entry_bytes_is_not_stored() -> None:
    store = ResponsesStore(config(max_entry_bytes=1024))
    assert not await store.put(entry("resp_big", text="x" * 2000))
    assert await store.get("acme", "resp_big") is None


class BrokenRedis:
    """A RedisResponses whose first `fail` calls fail (all of them by default), as a Redis
    that is down; then it answers from its dict, as a Redis that was slow once."""

    def __init__(self, fail: int = 10**9, error: Exception | None = None) -> None:
        self.calls, self.fail = 0, fail
        self.error = error or RedisConnectionError("down")
        self.blobs: dict[tuple[str, str], bytes] = {}

    def _call(self) -> None:
        self.calls += 1
        if self.calls <= self.fail:
            raise self.error

    async def put(self, tenant: str, rid: str, blob: bytes) -> int:
        self._call()
        self.blobs[tenant, rid] = blob
        return 0

    async def get(self, tenant: str, rid: str) -> bytes | None:
        self._call()
        return self.blobs.get((tenant, rid))

    async def delete(self, tenant: str, rid: str) -> bool:
        self._call()
        return self.blobs.pop((tenant, rid), None) is not None


@pytest.mark.asyncio
async def test_redis_down_keeps_entries_here_and_an_unknown_id_is_unavailable_not_404() -> None:
    clock = Clock()
    redis = BrokenRedis()
    store = ResponsesStore(config(), redis, retry_s=5.0, clock=clock)  # type: ignore[arg-type]
    assert await store.put(entry("resp_a"))  # Redis failed twice (a store retries): kept here
    assert store.shared and redis.calls == 2
    with pytest.raises(StoreUnavailable):  # the third failure in a row: Redis is down
        await store.get("acme", "resp_elsewhere")
    assert not store.shared and redis.calls == 3
    assert (await store.get("acme", "resp_a")).id == "resp_a"
    with pytest.raises(StoreUnavailable):  # not here, and Redis cannot say
        await store.get("acme", "resp_elsewhere")
    assert redis.calls == 3  # within retry_s Redis is not tried again
    assert await store.delete("acme", "resp_a")
    clock.now += 5
    with pytest.raises(StoreUnavailable):
        await store.get("acme", "resp_elsewhere")
    assert redis.calls == 4


@pytest.mark.asyncio
async def test_one_redis_timeout_fails_one_request_and_the_store_stays_shared() -> None:
    """Issue 42 finding 8: a single timeout moved the whole store to this process's memory
    for `retry_s` (every replica's new entries out of the others' sight). Now it fails only
    the request it happened to (503), and a store is tried once more."""
    redis = BrokenRedis(fail=1, error=RedisTimeoutError("slow"))
    store = ResponsesStore(config(), redis, retry_s=60.0, clock=Clock())  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        await store.get("acme", "resp_a")
    assert store.shared
    assert await store.put(entry("resp_a")) and ("resp_a" in {r for _, r in redis.blobs})
    redis.fail = redis.calls + 1  # one more timeout, on the store: retried at once
    assert await store.put(entry("resp_b")) and store.shared
    assert {r for _, r in redis.blobs} == {"resp_a", "resp_b"}  # both where replicas see them
    assert (await store.get("acme", "resp_b")).id == "resp_b"


def test_tenant_keys_are_fixed_length_and_distinct() -> None:
    assert len(tenant_key("a:b" * 1000)) == 32
    assert tenant_key("a") != tenant_key("b")
    raw = entry("resp_a").encode()
    assert StoredResponse.decode(raw) == entry("resp_a")
    assert StoredResponse.decode(b"{") is None and StoredResponse.decode(b"{}") is None
