"""`[redis]` through Sentinel: bad config names the file and the key; the client the router
builds asks the sentinels, with their secrets and TLS (no connection is opened here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuroute.router.config.redis import RedisConfig, RedisSentinelConfig
from gpuroute.router.config.router import load_router_config
from gpuroute.router.shared.redis_client import (
    NewestSentinels,
    PrimaryFollowingPool,
    SentinelRedis,
    open_redis,
)
from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

from gpuroute.config import ConfigError
from gpuroute.tls import ClientTlsConfig

SENTINELS = '[redis.sentinel]\naddresses = ["10.0.0.1:26379", "10.0.0.2:26379"]\n'


def load(tmp_path: Path, redis: str):
    path = tmp_path / "router.toml"
    backend = '[[backends]]\nurl = "http://10.0.0.9:8000"\ngpu = "L4"\nmodels = ["m"]\n'
    path.write_text(f"[listen]\nport = 0\n{backend}[redis]\n{redis}")
    return load_router_config(path)


@pytest.mark.parametrize(
    ("redis", "key", "fragment"),
    [
        (
            'url = "redis://h:6379/0"\n' + SENTINELS,
            "redis",
            "set url or [redis.sentinel], not both",
        ),
        ("[redis.sentinel]\naddresses = []\n", "redis.sentinel.addresses", "at least 1"),
        ('[redis.sentinel]\naddresses = ["10.0.0.1"]\n', "redis.sentinel.addresses", "host:port"),
        ('[redis.sentinel]\naddresses = ["h:0"]\n', "redis.sentinel.addresses", "host:port"),
        ('[redis.sentinel]\naddresses = ["h:1", "h:1"]\n', "redis.sentinel.addresses", "once"),
        (SENTINELS + 'service = "my master"\n', "redis.sentinel.service", "service name"),
        (SENTINELS + 'password = "x"\npassword_env = "X"\n', "redis.sentinel", "one form"),
        (SENTINELS + "recheck_s = 0\n", "redis.sentinel.recheck_s", "must be > 0"),
        (SENTINELS + "tls = { ca = 1 }\n", "redis.sentinel.tls.ca", "unknown key"),
    ],
)
def test_bad_sentinel_config_names_file_and_key(tmp_path, redis, key, fragment) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, redis)
    message = str(info.value)
    assert "router.toml" in message and key in message and fragment in message, message


def test_defaults_and_a_v6_address(tmp_path) -> None:
    config = load(tmp_path, '[redis.sentinel]\naddresses = ["[::1]:26379", "h:26380"]\n').redis
    assert config.configured and config.sentinel is not None and config.db == 0
    assert config.sentinel.hosts() == [("::1", 26379), ("h", 26380)]
    assert (config.sentinel.service, config.sentinel.recheck_s) == ("gpuroute", 1.0)
    assert config.sentinel.tls is None and config.sentinel.min_other_sentinels == 0
    assert not RedisConfig().configured


@pytest.mark.asyncio
async def test_the_client_asks_the_sentinels_with_their_secrets(tmp_path, monkeypatch) -> None:
    (tmp_path / "pass").write_text("data-secret\n")
    monkeypatch.setenv("SENTINEL_PASS", "sentinel-secret")
    sentinel = RedisSentinelConfig(
        addresses=["127.0.0.1:1", "127.0.0.1:2"], service="main", username="router",
        password_file=str(tmp_path / "pass"), sentinel_password_env="SENTINEL_PASS",
        min_other_sentinels=1, recheck_s=0.5,
    )  # fmt: skip
    client = open_redis(RedisConfig(sentinel=sentinel, db=3, timeout_s=0.2))
    assert isinstance(client, SentinelRedis)
    pool = client.connection_pool
    assert isinstance(pool, PrimaryFollowingPool) and isinstance(
        pool.sentinel_manager, NewestSentinels
    )
    assert (pool.service_name, pool.recheck_s, pool.is_master) == ("main", 0.5, True)
    assert pool.connection_class is SentinelManagedConnection
    data = pool.connection_kwargs
    assert (data["db"], data["username"], data["password"]) == (3, "router", "data-secret")
    assert data["socket_timeout"] == 0.2
    manager = pool.sentinel_manager
    assert manager.min_other_sentinels == 1
    one = manager.sentinels[0].connection_pool.connection_kwargs
    assert (one["host"], one["port"], one["password"]) == ("127.0.0.1", 1, "sentinel-secret")
    assert one["db"] == 0  # a sentinel has one, whatever the data connections use
    await client.aclose()


@pytest.mark.asyncio
async def test_tls_verifies_sentinels_and_redis(tmp_path) -> None:
    from gpuroute.testbed.certs import LocalCA
    from support import components

    components.binary("openssl")
    ca = LocalCA(tmp_path)
    tls = ClientTlsConfig(ca_file=str(ca.ca_file))
    client = open_redis(RedisConfig(sentinel=RedisSentinelConfig(addresses=["h:1"], tls=tls)))
    assert client is not None
    pool = client.connection_pool
    assert pool.connection_class is SentinelManagedSSLConnection
    for kwargs in (
        pool.connection_kwargs,
        pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs,
    ):
        assert kwargs["ssl_ca_certs"] == str(ca.ca_file)
        assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("required", True)
    await client.aclose()


def test_unreadable_secrets_and_tls_files_name_the_key(tmp_path) -> None:
    missing = str(tmp_path / "nope")
    bad_password = RedisSentinelConfig(addresses=["h:1"], password_file=missing)
    with pytest.raises(ConfigError, match=r"^redis\.sentinel\.password_file: cannot read"):
        open_redis(RedisConfig(sentinel=bad_password))
    unset = RedisSentinelConfig(addresses=["h:1"], sentinel_password_env="GPUROUTE_NO_SUCH_VAR")
    with pytest.raises(ConfigError, match=r"^redis\.sentinel\.sentinel_password_env: environ"):
        open_redis(RedisConfig(sentinel=unset))
    bad_ca = RedisSentinelConfig(addresses=["h:1"], tls=ClientTlsConfig(ca_file=missing))
    with pytest.raises(ConfigError, match=r"^redis\.sentinel\.tls: cannot load CA file"):
        open_redis(RedisConfig(sentinel=bad_ca))
