"""The router's one Redis client: every Redis user (quotas, sessions, shared load, keys,
usage records, stored responses, used residency decisions) is handed this one, and the
router closes it. redis-py connects lazily, so building it does no I/O.

With a URL, `rediss://` uses TLS, with `ssl_ca_certs` and friends as query parameters
(redis-py reads them from the URL). With `[redis.sentinel]`, each new connection asks the
sentinels where the primary is (redis-py's `master_for`), and a connection to a demoted or
dead primary is dropped, so after a failover every user reaches the promoted replica."""

from __future__ import annotations

import ssl
from typing import Any

import redis.asyncio as aioredis
from gpuroute.router.redis_config import RedisConfig, RedisSentinelConfig
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisError

from gpuroute.secrets import read_secret
from gpuroute.tls import ClientTlsConfig, client_context

# what a Redis call raises when Redis is down, slow or refusing (callers fall back or keep)
REDIS_ERRORS = (RedisError, OSError, TimeoutError)


class SentinelRedis(aioredis.Redis):
    """The primary's client; closing it also closes its connections to the sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        await self.connection_pool.sentinel_manager.aclose()


def open_redis(config: RedisConfig) -> aioredis.Redis | None:
    """The client for `[redis]` (None: not configured); ConfigError naming the key when a
    secret or a TLS file cannot be read."""
    timeouts = {"socket_timeout": config.timeout_s, "socket_connect_timeout": config.timeout_s}
    if config.sentinel is not None:
        return _through_sentinel(config.sentinel, config.db, timeouts)
    url = read_secret(config, "url", "redis")
    if not url:
        return None
    return aioredis.from_url(url, **timeouts)


def _through_sentinel(
    sentinel: RedisSentinelConfig, db: int, timeouts: dict[str, float]
) -> aioredis.Redis:
    tls = _tls(sentinel.tls, "redis.sentinel.tls")
    where = "redis.sentinel"
    manager = Sentinel(
        sentinel.hosts(),
        min_other_sentinels=sentinel.min_other_sentinels,
        sentinel_kwargs={
            **timeouts,
            **tls,
            "username": sentinel.sentinel_username,
            "password": read_secret(sentinel, "sentinel_password", where),
        },
        **timeouts,
        **tls,
        db=db,
        username=sentinel.username,
        password=read_secret(sentinel, "password", where),
    )
    return manager.master_for(sentinel.service, redis_class=SentinelRedis)


def _tls(tls: ClientTlsConfig | None, where: str) -> dict[str, Any]:
    """redis-py's TLS arguments (certificate and name always verified); the files are
    loaded once here, so a missing or bad one is a config error, not a silent fallback."""
    if tls is None:
        return {}
    client_context(tls, where)
    return {
        "ssl": True,
        "ssl_ca_certs": tls.ca_file,
        "ssl_certfile": tls.cert_file,
        "ssl_keyfile": tls.key_file,
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_min_version": ssl.TLSVersion.TLSv1_2,
    }
