"""Where the Responses API's stored responses live: Redis when `[redis]` is configured (every
replica reads what any stored, router/responses/redis_store.py), else this process's memory.
Either way each entry is kept under its tenant and its id, for `ttl_s`, and each tenant
holds at most `max_per_tenant` entries and `max_bytes_per_tenant` bytes (the oldest go
first). An entry is one JSON document (StoredResponse): the response object and the
conversation's input items, so a follow-up's whole input is one read.

A Redis call that fails once (a timeout, a dropped connection) fails only its own request:
a read or a delete raises StoreUnavailable (a 503, never a false 404), a store is tried
once more. Only `FAILURES_TO_FALL_BACK` failures in a row say that Redis is down: then a
replica keeps what it stores locally and reads its local entries too, and tries Redis again
after `retry_s` (a single slow answer no longer moved every replica's new entries out of
each other's sight)."""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from gpuroute.router.config.responses import ResponsesConfig
from gpuroute.router.responses.redis_store import RedisResponses
from gpuroute.router.shared.redis_client import REDIS_ERRORS

log = logging.getLogger("gpuroute.router.responses")
# what an engine's response id looks like (vLLM: resp_ and 32 hex digits); anything else
# is no id of ours: unknown, and never a Redis key
RESPONSE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
FAILURES_TO_FALL_BACK = 3  # Redis calls failed in a row: down, not slow once


class StoreUnavailable(Exception):
    """Redis could not answer and the entry is not kept here."""


def tenant_key(tenant: str) -> str:
    """A tenant as a fixed-length key part (a tenant name may hold `:` or be long)."""
    return hashlib.blake2b(tenant.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A completed response as the router keeps it: the engine's response object (with the
    client's `previous_response_id`), the input items it was given after expansion (the
    conversation before it), whose it is and when it was stored (Unix seconds)."""

    response: dict[str, Any]
    input: list[Any]
    tenant: str
    created: float

    @property
    def id(self) -> str:
        return str(self.response.get("id", ""))

    def conversation(self) -> list[Any]:
        """The conversation it ends: its input items, then its output items."""
        output = self.response.get("output")
        return [*self.input, *(output if isinstance(output, list) else ())]

    def encode(self) -> bytes:
        return orjson.dumps(
            {"response": self.response, "input": self.input, "tenant": self.tenant,
             "created": self.created}
        )  # fmt: skip

    @classmethod
    def decode(cls, blob: bytes) -> StoredResponse | None:
        try:
            doc = orjson.loads(blob)
            return cls(doc["response"], doc["input"], doc["tenant"], doc["created"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None


class MemoryStore:
    """This process's entries: per tenant, in the order stored (so the oldest, and the
    first to expire, come first)."""

    def __init__(
        self, config: ResponsesConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s, self.clock = config.ttl_s, clock
        self.max_count, self.max_bytes = config.max_per_tenant, config.max_bytes_per_tenant
        self.tenants: dict[str, OrderedDict[str, tuple[bytes, float]]] = {}
        self.sizes: dict[str, int] = {}  # bytes held per tenant

    def put(self, tenant: str, rid: str, blob: bytes) -> None:
        entries = self.tenants.setdefault(tenant, OrderedDict())
        self.delete(tenant, rid)
        entries[rid] = (blob, self.clock() + self.ttl_s)
        self.sizes[tenant] = self.sizes.get(tenant, 0) + len(blob)
        self._expire(tenant)
        while len(entries) > self.max_count or self.sizes[tenant] > self.max_bytes:
            self._drop(tenant, next(iter(entries)))

    def get(self, tenant: str, rid: str) -> bytes | None:
        self._expire(tenant)
        held = self.tenants.get(tenant, {}).get(rid)
        return None if held is None else held[0]

    def delete(self, tenant: str, rid: str) -> bool:
        if rid not in self.tenants.get(tenant, {}):
            return False
        self._drop(tenant, rid)
        return True

    def _drop(self, tenant: str, rid: str) -> None:
        entries = self.tenants[tenant]
        blob, _ = entries.pop(rid)
        self.sizes[tenant] -= len(blob)
        if not entries:
            del self.tenants[tenant], self.sizes[tenant]

    def _expire(self, tenant: str) -> None:
        now = self.clock()
        entries = self.tenants.get(tenant)
        while entries and next(iter(entries.values()))[1] <= now:
            self._drop(tenant, next(iter(entries)))
            entries = self.tenants.get(tenant)


class ResponsesStore:
    """Redis first (when configured), this process's memory while Redis is down."""

    def __init__(
        self,
        config: ResponsesConfig,
        redis: RedisResponses | None = None,
        *,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.local = MemoryStore(config, clock)
        self.redis, self.retry_s, self.clock = redis, retry_s, clock
        self.max_entry_bytes = config.max_entry_bytes
        self._down_until = 0.0
        self._failures = 0  # Redis calls failed in a row

    @property
    def shared(self) -> bool:
        """Entries are in Redis now (every replica sees them)."""
        return self.redis is not None and self.clock() >= self._down_until

    async def put(self, entry: StoredResponse) -> bool:
        """Keep `entry` (False: too large, or its id is none an engine gives)."""
        blob, rid = entry.encode(), entry.id
        if len(blob) > self.max_entry_bytes or not RESPONSE_ID.fullmatch(rid):
            log.warning("response %.40r not stored: %d bytes or a foreign id", rid, len(blob))
            return False
        tenant = tenant_key(entry.tenant)
        for _ in range(2):  # a store fails its request silently: one more try first
            if self.redis is None or not self.shared:
                break
            try:
                await self.redis.put(tenant, rid, blob)
                self._failures = 0
                return True
            except REDIS_ERRORS as exc:
                self._failed(exc)
        self.local.put(tenant, rid, blob)  # kept here (read first on this replica)
        return True

    async def get(self, tenant: str, rid: str) -> StoredResponse | None:
        """`tenant`'s entry `rid` (None: none, or another tenant's); StoreUnavailable when
        Redis could not say and it is not here."""
        if not RESPONSE_ID.fullmatch(rid):
            return None
        key = tenant_key(tenant)
        blob = self.local.get(key, rid)
        if blob is None and self.redis is not None:
            if not self.shared:
                raise StoreUnavailable
            try:
                blob = await self.redis.get(key, rid)
                self._failures = 0
            except REDIS_ERRORS as exc:
                self._failed(exc)
                raise StoreUnavailable from None
        entry = None if blob is None else StoredResponse.decode(blob)
        # the key holds the tenant already; a second check costs nothing
        return entry if entry is not None and entry.tenant == tenant else None

    async def delete(self, tenant: str, rid: str) -> bool:
        if not RESPONSE_ID.fullmatch(rid):
            return False
        key = tenant_key(tenant)
        if self.local.delete(key, rid):  # kept here while Redis was down: nowhere else
            return True
        if self.redis is None:
            return False
        if not self.shared:
            raise StoreUnavailable
        try:
            deleted = await self.redis.delete(key, rid)
        except REDIS_ERRORS as exc:
            self._failed(exc)
            raise StoreUnavailable from None
        self._failures = 0
        return deleted

    def _failed(self, exc: BaseException) -> None:
        """One more failure in a row; at `FAILURES_TO_FALL_BACK`, local for `retry_s`."""
        self._failures += 1
        if self._failures < FAILURES_TO_FALL_BACK:
            log.warning("responses store: Redis did not answer (%s); that request fails", exc)
            return
        self._failures = 0
        self._down_until = self.clock() + self.retry_s
        log.warning("responses store: Redis unavailable (%s); keeping responses locally", exc)
