"""The router's one Redis client (quotas, sessions and shared load use it; the router closes
it). redis-py connects lazily, so building it does no I/O. `rediss://` URLs use TLS, with
`ssl_ca_certs` and friends as query parameters (redis-py reads them from the URL)."""

from __future__ import annotations

import redis.asyncio as aioredis
from gpuroute.router.config import RedisConfig
from redis.exceptions import RedisError

from gpuroute.secrets import read_secret

# what a Redis call raises when Redis is down, slow or refusing (callers fall back or keep)
REDIS_ERRORS = (RedisError, OSError, TimeoutError)


def open_redis(config: RedisConfig) -> aioredis.Redis | None:
    url = read_secret(config, "url", "redis")
    if not url:
        return None
    return aioredis.from_url(
        url, socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s
    )
