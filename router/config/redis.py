"""The `[redis]` section: one Redis for the replicas' shared state (quotas, sessions, load,
keys, usage records, stored responses, used residency decisions), reached by a URL or
through Sentinel (`[redis.sentinel]`), which follows a failover to the promoted replica.
Apart from the client (router/shared/redis_client.py) so that loading a config imports no Redis."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from gpuroute.config import StrictModel
from gpuroute.secrets import secret_forms
from gpuroute.tls import ClientTlsConfig

SERVICE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def host_port(value: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` as (host, port); ValueError saying what was expected."""
    host, colon, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"expected host:port, got {value!r}")
    return host, int(port)


class RedisSentinelConfig(StrictModel):
    """Sentinels that watch one primary (`service`); every connection asks them where it is,
    so a failover moves every Redis user of the router to the promoted replica."""

    addresses: list[str] = Field(min_length=1)  # host:port of each sentinel (3 or more)
    service: str = "gpuroute"  # the name the sentinels monitor (`sentinel monitor <name>`)
    # the data connections' AUTH (Redis ACL user, else the default user)
    username: str | None = None
    password: str | None = None
    password_file: str | None = None
    password_env: str | None = None
    # the sentinels' own AUTH (`requirepass` in sentinel.conf), when they have one
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    sentinel_password_file: str | None = None
    sentinel_password_env: str | None = None
    check_secret_forms = secret_forms("password", "sentinel_password")
    # sentinels whose view counts: at least this many peers seen (0: any sentinel's answer)
    min_other_sentinels: int = Field(default=0, ge=0)
    # how often the sentinels are asked whether the primary moved: a primary demoted by a
    # forced failover keeps taking writes (lost when it resyncs) until it is reconfigured
    recheck_s: float = Field(default=1.0, gt=0, le=60)
    # set (even empty: the system's roots): TLS to the sentinels and to Redis, verified
    tls: ClientTlsConfig | None = None

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, addresses: list[str]) -> list[str]:
        for address in addresses:
            host_port(address)
        if len(set(addresses)) != len(addresses):
            raise ValueError("each sentinel address once")
        return addresses

    @field_validator("service")
    @classmethod
    def _service(cls, service: str) -> str:
        if not SERVICE_NAME.match(service):
            raise ValueError(f"expected a sentinel service name ([A-Za-z0-9._-]), got {service!r}")
        return service

    def hosts(self) -> list[tuple[str, int]]:
        return [host_port(a) for a in self.addresses]


class RedisConfig(StrictModel):
    # e.g. redis://127.0.0.1:6379/0, or rediss://:password@host:6380/0 with TLS; the URL
    # holds the password, so url_file and url_env are its secret forms; unset: per replica
    url: str | None = None
    url_file: str | None = None
    url_env: str | None = None
    check_secret_forms = secret_forms("url")
    sentinel: RedisSentinelConfig | None = None  # instead of url: follow a failover
    db: int = Field(default=0, ge=0)  # the database number with `sentinel` (a URL names it)

    @property
    def configured(self) -> bool:
        return self.sentinel is not None or bool(self._urls_set())

    def _urls_set(self) -> list[str]:
        return [n for n in ("url", "url_file", "url_env") if getattr(self, n) is not None]

    @model_validator(mode="after")
    def _one_way(self) -> RedisConfig:
        if (urls := self._urls_set()) and self.sentinel is not None:
            raise ValueError(f"set {urls[0]} or [redis.sentinel], not both")
        return self

    prefix: str = "gpuroute"
    timeout_s: float = Field(default=0.05, gt=0)  # per call; beyond it, fall back
    retry_s: float = Field(default=1.0, gt=0)  # after a failure, local buckets this long
    local_fraction: float = Field(default=1.0, gt=0, le=1)  # of each quota, per replica, while down
    share_load: bool = True  # publish and read replicas' outstanding work (needs url or sentinel)
    publish_interval_s: float = Field(default=0.1, gt=0)
    pick_among: int = Field(default=2, ge=1)  # least outstanding work: random among best k
    session_ttl_s: float = Field(default=1800.0, ge=0)  # session -> backend memory (0 = off)
