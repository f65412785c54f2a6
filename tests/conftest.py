"""Fixtures shared by every suite (tests/unit, tests/integration, tests/system)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def lab(tmp_path):
    """Network namespaces on a bridge (tests/support/netns.py), with the pinned Consul available."""
    from gpuroute.testbed.consul_dev import HOW_TO_GET_CONSUL, consul_binary
    from support.netns import NetnsLab, netns_available

    why = netns_available()
    if why:
        pytest.skip(why)
    if consul_binary() is None:
        pytest.skip(HOW_TO_GET_CONSUL)
    lab = NetnsLab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def redis(tmp_path):
    """A real redis-server on a free loopback port (tests/support/redis_server.py)."""
    from support.redis_server import HOW_TO_GET_REDIS, RedisServer, redis_binary

    if redis_binary() is None:
        pytest.skip(HOW_TO_GET_REDIS)
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def consul(tmp_path):
    """A real `consul agent -dev` on free loopback ports (testbed/consul_dev.py)."""
    from gpuroute.testbed.consul_dev import HOW_TO_GET_CONSUL, ConsulDev, consul_binary

    binary = consul_binary()
    if binary is None:
        pytest.skip(HOW_TO_GET_CONSUL)
    with ConsulDev(binary, log_path=tmp_path / "consul.log") as dev:
        yield dev
