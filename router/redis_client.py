"""The router's one Redis client (quotas, sessions and shared load use it; the router closes
it). redis-py connects lazily, so building it does no I/O."""

from __future__ import annotations

import redis.asyncio as aioredis
from gpuroute.router.config import RedisConfig


def open_redis(config: RedisConfig) -> aioredis.Redis | None:
    if not config.url:
        return None
    return aioredis.from_url(
        config.url, socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s
    )
