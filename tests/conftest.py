"""Fixtures shared by every suite (tests/unit, tests/integration, tests/system)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support import components
from support.paths import REPO

# Property tests run on shared 2-core machines: a stalled example is the machine, not a bug.
# No per-example deadline (hypothesis' default is 200 ms) and no health check for slow data
# generation; every @given test inherits this unless it sets its own.
settings.register_profile(
    "gpuroute", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gpuroute"))
SLOW_TIMEOUT_S = 900  # pytest-timeout's ceiling for slow and real-engine tests (300 otherwise)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Each skip is listed in the run's summary (-ra) under the test's name and line, also
    when a helper in tests/support or a fixture raised it, so the list says which tests did
    not run and why."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple):
        _path, _line, reason = report.longrepr
        test_file, def_line, _ = item.location
        why = reason.removeprefix("Skipped: ")
        report.longrepr = (test_file, def_line + 1, f"{item.name}: {why}")
    return report


# xdist's loadgroup (the Makefile's `make test`) keeps each group on one worker: a real
# vLLM is a core's worth of work on 2 cores and starts in 20-60 s, so one worker runs them
# all, one engine at a time (testbed/real_vllm.py pins it to core 0)
REAL_ENGINE_GROUP = "real_engine"
WIDE_SCOPES = ("module", "class", "package")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Clusters, outages and a real vLLM's start take minutes on 2 cores: their tests get a
    larger ceiling than `timeout` in pyproject.toml, unless they mark their own. Under
    xdist each test is placed on its own unless it shares an engine or a module's fixture."""
    for item in items:
        slow = item.get_closest_marker("slow") or item.get_closest_marker("real_engine")
        if slow and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        if item.get_closest_marker("xdist_group") is None and (group := xdist_group(item)):
            item.add_marker(pytest.mark.xdist_group(group))


def xdist_group(item: pytest.Item) -> str | None:
    """The real-engine tests run on one worker; a module whose fixture outlives a test
    (a cluster, a planned fleet) runs on one worker, so that the fixture starts once."""
    if item.get_closest_marker("real_engine"):
        return REAL_ENGINE_GROUP
    fixtures = getattr(item, "_fixtureinfo", None)
    for defs in fixtures.name2fixturedefs.values() if fixtures else ():
        # the suite's own fixtures (a plugin's have no baseid): those a module shares
        if any(d.scope in WIDE_SCOPES and d.baseid for d in defs):
            return item.nodeid.split("::", 1)[0]
    return None


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def lab(tmp_path):
    """Network namespaces on a bridge (tests/support/netns.py), with the pinned Consul available."""
    from support.netns import NetnsLab, netns_available

    why = netns_available()
    if why:
        pytest.skip(why)  # root and iproute2: nothing `make test` installs
    components.consul()
    lab = NetnsLab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def redis(tmp_path):
    """A real redis-server on a free loopback port (tests/support/redis_server.py)."""
    from support.redis_server import RedisServer

    components.redis()
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sentinel(tmp_path, request):
    """A real primary, replica and three sentinels on free loopback ports
    (tests/support/redis_sentinel.py); parametrized indirectly: the primary's
    min-replicas-to-write."""
    from support.redis_sentinel import SentinelDeployment

    components.redis()
    deployment = SentinelDeployment(tmp_path, min_replicas=getattr(request, "param", 0))
    try:
        deployment.start()
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture
def consul(tmp_path):
    """A real `consul agent -dev` on free loopback ports (testbed/consul_dev.py)."""
    from gpuroute.testbed.consul_dev import ConsulDev

    with ConsulDev(components.consul(), log_path=tmp_path / "consul.log") as dev:
        yield dev
