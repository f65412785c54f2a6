"""Shared fixtures: paths, and a marker for tests that need ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or skip the test with a message when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"{path} not present (../shared/data is only on the project's machines)")
    return path


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def lab(tmp_path):
    """Network namespaces on a bridge (tests/netns.py), with the pinned Consul available."""
    from netns import NetnsLab, netns_available

    from gpuroute.consul_dev import HOW_TO_GET_CONSUL, consul_binary

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
    """A real redis-server on a free loopback port (tests/redis_server.py)."""
    from redis_server import HOW_TO_GET_REDIS, RedisServer, redis_binary

    if redis_binary() is None:
        pytest.skip(HOW_TO_GET_REDIS)
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
