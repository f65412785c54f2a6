"""The suite's own guards against flakes and silent gaps on shared 2-core machines."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, settings
from support.live import async_wait_for


def test_property_tests_have_no_per_example_deadline() -> None:
    """tests/conftest.py's profile: hypothesis' 200 ms default fails a stalled machine."""
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check


def test_every_test_has_a_ceiling(pytestconfig, request) -> None:
    assert pytestconfig.getini("timeout") == "300"
    assert request.node.get_closest_marker("timeout") is None  # the ini's 300 s applies


@pytest.mark.real_engine
def test_slow_and_real_engine_tests_get_900_s(request) -> None:
    assert request.node.get_closest_marker("timeout").args == (900,)


@pytest.mark.asyncio
async def test_async_wait_for_bounds_a_check_that_hangs() -> None:
    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    with pytest.raises(AssertionError) as failed:
        await asyncio.wait_for(async_wait_for(hangs, 0.2, "a hung check"), 10)
    assert str(failed.value) == "timed out after 0.2 s waiting for a hung check"


@pytest.mark.asyncio
async def test_async_wait_for_passes_on_a_checks_own_timeout() -> None:
    async def times_out() -> bool:
        raise TimeoutError("the check's own client gave up")

    with pytest.raises(TimeoutError) as raised:
        await async_wait_for(times_out, 10, "never")
    assert str(raised.value) == "the check's own client gave up"
