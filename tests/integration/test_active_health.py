"""Active health checks of static backends (issue 45): a killed engine leaves rotation
within `health.interval_s × health.failures_out`, before any request finds it dead, and
comes back once its checks pass again."""

from __future__ import annotations

import contextlib
import time

import aiohttp
import pytest
from support.live import (
    FakeEngineProcess,
    async_wait_for,
    backends_state,
    chat_body,
    fake_engines,
    router_toml,
    running_router,
)

pytestmark = pytest.mark.asyncio
INTERVAL_S, FAILURES_OUT = 0.2, 3


@contextlib.asynccontextmanager
async def doomed_and_steady(tmp_path, health: str):
    """Two fake engines behind round robin (without checks, every other request would go to
    the first, the one a test kills): (the doomed engine, its id, url, app, session)."""
    with fake_engines(("H100", 0.01), ("H100", 0.01)) as (doomed, steady):
        config = router_toml(
            [(doomed.url, "H100"), (steady.url, "H100")], policy="round_robin", health=health,
            breaker="cooldown_s = 0.3\nprobes_to_close = 2",
        )  # fmt: skip
        async with running_router(config, tmp_path) as (url, app), aiohttp.ClientSession() as s:
            yield doomed, f"127.0.0.1:{doomed.port}", url, app, s


async def test_a_killed_static_backend_leaves_rotation_before_a_request_finds_it(
    tmp_path,
) -> None:
    health = f"interval_s = {INTERVAL_S}\nfailures_out = {FAILURES_OUT}\ntimeout_s = 0.5"
    async with doomed_and_steady(tmp_path, health) as (doomed, doomed_id, url, app, s):

        async def state() -> dict:
            return (await backends_state(s, url))[doomed_id]

        doomed.kill()
        killed_at = time.monotonic()

        async def out() -> bool:
            return (await state())["state"] == "ejected"

        await async_wait_for(out, 10, "the killed backend out of rotation")
        took = time.monotonic() - killed_at
        # each check is started by the router's tick (0.05 s) and may wait its timeout
        assert took <= INTERVAL_S * FAILURES_OUT + INTERVAL_S + 0.5, took
        for _ in range(10):
            async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
                assert r.status == 200
        assert failed_on(app, doomed_id) == 0  # no request was ever sent to it
        # it restarts on its port: back in once a check passes and the breaker's probes do
        back = FakeEngineProcess("H100", time_scale=0.01, port=doomed.port)
        try:

            async def returned() -> bool:
                now = await state()
                return now["breaker"] == "closed" and now["state"] in ("ready", "warming")

            await async_wait_for(returned, 10, "the restarted backend back in rotation")
        finally:
            back.stop()


def failed_on(app, backend_id: str) -> float:
    """The attempts that failed on `backend_id`, of every kind."""
    return sum(
        sample.value
        for metric in app.metrics.upstream_failures.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["backend"] == backend_id
    )


async def test_without_checks_a_request_finds_the_dead_backend(tmp_path) -> None:
    """`health.interval_s = 0`: nothing looks, so the next request sent there fails over
    (retried elsewhere), which is what the checks spare."""
    async with doomed_and_steady(tmp_path, "interval_s = 0") as (doomed, doomed_id, url, app, s):
        doomed.kill()
        for _ in range(4):
            async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
                assert r.status == 200  # retried onto the steady engine
        assert failed_on(app, doomed_id) >= 1
