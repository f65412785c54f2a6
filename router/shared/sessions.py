"""Session → backend, shared by router replicas through Redis (with a TTL), so a
conversation's follow-up turns reach the backend holding its KV cache whichever replica
takes them. A remembered backend is used only while it is routable and has room; Redis
trouble just means no preference (never a failed request)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from gpuroute.router.config.redis import RedisConfig
from gpuroute.router.shared.redis_client import REDIS_ERRORS

log = logging.getLogger("gpuroute.router.shared.sessions")


class SessionStore:
    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "gpuroute",
        ttl_s: float = 1800.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis  # owned (and closed) by whoever built it
        self.prefix, self.ttl_ms = prefix, int(ttl_s * 1000)
        self.retry_s, self.clock = retry_s, clock
        self._down_until = 0.0

    @classmethod
    def from_config(
        cls, redis: RedisConfig, client: aioredis.Redis | None, clock: Callable[[], float]
    ) -> SessionStore | None:
        """The store, or None when Redis or session memory is off."""
        if client is None or redis.session_ttl_s <= 0:
            return None
        return cls(
            client, prefix=redis.prefix, ttl_s=redis.session_ttl_s,
            retry_s=redis.retry_s, clock=clock,
        )  # fmt: skip

    def _key(self, session: str) -> str:
        return f"{self.prefix}:session:{session}"

    async def get(self, session: str) -> str | None:
        if self.clock() < self._down_until:
            return None
        try:
            value = await self.redis.get(self._key(session))
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return None
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else value

    async def put(self, session: str, backend_id: str) -> None:
        if self.clock() < self._down_until:
            return
        try:
            await self.redis.set(self._key(session), backend_id, px=self.ttl_ms)
        except REDIS_ERRORS as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self._down_until = self.clock() + self.retry_s
        log.warning("session store: Redis unavailable (%s); no session preference", exc)
