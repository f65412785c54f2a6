"""The router's one Redis client: every Redis user (quotas, sessions, shared load, keys,
usage records, stored responses, used residency decisions) is handed this one, and the
router closes it. redis-py connects lazily, so building it does no I/O.

With a URL, `rediss://` uses TLS, with `ssl_ca_certs` and friends as query parameters
(redis-py reads them from the URL). With `[redis.sentinel]`, each new connection asks the
sentinels where the primary is (redis-py's `master_for`), and a connection to a demoted or
dead primary is dropped, so after a failover every user reaches the promoted replica."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from typing import Any

import redis.asyncio as aioredis
from gpuroute.router.config.redis import RedisConfig, RedisSentinelConfig
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.exceptions import RedisError

from gpuroute.secrets import read_secret
from gpuroute.tls import ClientTlsConfig, client_context

log = logging.getLogger("gpuroute.router.redis")
# what a Redis call raises when Redis is down, slow or refusing (callers fall back or keep)
REDIS_ERRORS = (RedisError, OSError, TimeoutError)


class SentinelRedis(aioredis.Redis):
    """The primary's client; closing it also closes its connections to the sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await self.connection_pool.stop_checking()
        await super().aclose(close_connection_pool)
        await self.connection_pool.sentinel_manager.aclose()


class NewestSentinels(Sentinel):
    """Asks every sentinel at once and believes the newest configuration epoch: after a
    failover the others learn of it only from the leader's hello messages (up to 2 s), and
    redis-py's first answer may name the demoted primary for that long."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        answers = await asyncio.gather(
            *(s.sentinel_masters() for s in self.sentinels), return_exceptions=True
        )
        states = [a.get(service_name) for a in answers if isinstance(a, dict)]
        valid = [s for s in states if s and self.check_master_state(s, service_name)]
        if not valid:
            errors = ", ".join(repr(a) for a in answers if isinstance(a, BaseException))
            raise MasterNotFoundError(f"No master found for {service_name!r}: {errors}")
        newest = max(valid, key=lambda state: state["config-epoch"])
        return newest["ip"], newest["port"]


class PrimaryFollowingPool(SentinelConnectionPool):
    """redis-py's pool asks the sentinels only when it opens a connection, so pooled ones
    stay with a primary that a forced failover demoted, which accepts writes until Sentinel
    reconfigures it (seconds) and then drops them in its resync. This one also asks at most
    every `recheck_s`, in the background (no command waits for the sentinels), and whoever
    learns that the primary moved (a recheck, or a connection being opened) closes every
    connection to the old one, those in use too."""

    def __init__(self, service_name: str, sentinel_manager: NewestSentinels, **kwargs: Any) -> None:
        self.recheck_s: float = kwargs.pop("recheck_s")
        super().__init__(service_name, sentinel_manager, **kwargs)
        self._checked = -math.inf
        self._check: asyncio.Task | None = None

    async def get_connection(self, *_deprecated: Any, **_options: Any) -> Any:
        now = time.monotonic()
        idle = self._check is None or self._check.done()
        if idle and now - self._checked >= self.recheck_s:
            self._checked = now
            self._check = asyncio.get_running_loop().create_task(self._recheck())
        return await super().get_connection()

    async def get_master_address(self) -> Any:
        before = self.master_address
        after = await super().get_master_address()  # (it closes only idle connections)
        if before is not None and after != before:
            log.warning("Redis primary moved from %s:%s to %s:%s", *before, *after)
            await self.disconnect(inuse_connections=True)
        return after

    async def _recheck(self) -> None:
        with contextlib.suppress(*REDIS_ERRORS):  # (the next command meets it and is told)
            await self.get_master_address()

    async def stop_checking(self) -> None:
        if self._check is not None and not self._check.done():
            self._check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._check


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
    manager = NewestSentinels(
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
    return manager.master_for(
        sentinel.service,
        redis_class=SentinelRedis,
        connection_pool_class=PrimaryFollowingPool,
        recheck_s=sentinel.recheck_s,
    )


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
