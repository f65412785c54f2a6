"""Autoscaling live, end to end: a real Consul, a router process sizing its pool
(`[autoscale]`, a small capacity_rps so that a modest burst needs more backends), and
`gpuroute scale`'s loop with the local executor (hosts: a fake engine and its real agent
each). A bounded burst through the official openai client makes the desired size grow:
hosts are added (the router's backends grow, read through its admin API with its token);
a quiet spell then drains and stops them, and not one request of the run fails."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import aiohttp
import pytest
from gpuroute.router.scaling.scaler import RouterAdmin, Scaler
from gpuroute.testbed.local_scaler import LocalFleet, LocalFleetSettings
from gpuroute.testbed.loopback import consul_router_toml, quick_autoscale_toml
from gpuroute.testbed.processes import spawn, wait_http
from openai import AsyncOpenAI
from support.live import MODEL, async_wait_for, free_ports

pytestmark = pytest.mark.asyncio
TOKEN = "autoscale-live-admin-token"
BURST_RPS, BURST_S = 6.0, 12.0  # needs ceil(6 / (2 x 0.8)) = 4 in rotation, 3 the most
BURST_MAX_S = 60.0  # the burst's ceiling while the added hosts boot
TRICKLE_RPS, QUIET_MAX_S = 0.5, 60.0


class Outcomes:
    def __init__(self) -> None:
        self.sent = self.ok = 0
        self.errors: list[str] = []
        self.pending: set[asyncio.Task] = set()


async def one(client: AsyncOpenAI, outcomes: Outcomes) -> None:
    """One streamed chat; ok when it ends with a finish reason and no error."""
    outcomes.sent += 1
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "scale " * 30}],
            max_tokens=24, stream=True,
        )  # fmt: skip
        finish = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        if finish is None:
            raise RuntimeError("the stream ended without a finish reason")
        outcomes.ok += 1
    except Exception as exc:  # every failure is counted and shown
        outcomes.errors.append(repr(exc))


async def paced(client: AsyncOpenAI, rate: float, seconds: float, until, outcomes) -> None:
    """Open loop at `rate`, at most `seconds` long and `rate * seconds` requests, or until
    `until()` holds."""
    start = time.monotonic()
    for n in range(int(rate * seconds)):
        if until():
            break
        task = asyncio.create_task(one(client, outcomes))
        outcomes.pending.add(task)
        task.add_done_callback(outcomes.pending.discard)
        await asyncio.sleep(max(start + (n + 1) / rate - time.monotonic(), 0))  # the pace


async def pool(admin: aiohttp.ClientSession, admin_url: str) -> dict:
    """The router's view: its backends of the pool by state, and its sizing."""
    async with admin.get(admin_url + "/admin/backends") as r:
        assert r.status == 200, await r.text()
        backends = [b for b in (await r.json())["backends"] if MODEL in b["models"]]
    async with admin.get(admin_url + "/admin/autoscale") as r:
        assert r.status == 200, await r.text()
        sizing = (await r.json())["pools"].get(MODEL, {})
    return {
        "backends": len(backends),
        "states": sorted(f"{b['id']}:{b['state']}:{b['reason']}" for b in backends),
        **sizing,
    }


@contextlib.asynccontextmanager
async def scaled_router(consul, tmp_path):
    """A router process with [autoscale], and the scaler's loop with the local executor;
    yields (router URL, admin URL, the executor)."""
    (token_file := tmp_path / "admin-token").write_text(TOKEN)
    port, admin_port = free_ports(2)
    config = consul_router_toml(port, admin_port, consul.address, str(token_file))
    config += quick_autoscale_toml(MODEL)
    (tmp_path / "router.toml").write_text(config)
    cmd = [sys.executable, "-m", "gpuroute.cli", "router", "--config", "router.toml"]
    router = spawn("router", cmd, tmp_path, port)
    local = None
    stop, loop = asyncio.Event(), None
    try:
        await asyncio.to_thread(wait_http, f"http://127.0.0.1:{port}/healthz", 60, router.proc,
                                "router")  # fmt: skip
        admin_url = f"http://127.0.0.1:{admin_port}"
        settings = LocalFleetSettings(
            consul=consul.address, workdir=tmp_path / "hosts", boot_delay_s=1.0, max_hosts=5
        )
        local = LocalFleet(settings)
        await local.start()
        loop = asyncio.create_task(Scaler([RouterAdmin(admin_url, TOKEN)], local).run(stop))
        yield f"http://127.0.0.1:{port}", admin_url, local
    finally:
        stop.set()
        if loop is not None:
            await loop
        if local is not None:
            await local.close()
        await asyncio.to_thread(router.stop)


async def test_a_burst_adds_hosts_and_a_quiet_spell_drains_them_losing_no_request(
    consul, tmp_path
) -> None:
    outcomes, seen = Outcomes(), []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        scaled_router(consul, tmp_path) as (url, admin_url, local),
        aiohttp.ClientSession(headers=headers) as admin,
    ):
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

        async def view(predicate) -> bool:
            seen.append((time.monotonic(), now := await pool(admin, admin_url)))
            return predicate(now)

        floor = lambda p: p.get("in_rotation") == 1 and p.get("standby") == 1  # noqa: E731
        await async_wait_for(lambda: view(floor), 60, "one host in rotation, one standby")
        start = time.monotonic()
        # the burst lasts its 12 s and until a host beyond the first two is in service: on a
        # loaded machine hosts boot slower than the burst, and hosts that come up after it
        # are (rightly) cancelled mid-start, which leaves nothing to drain
        added = lambda: time.monotonic() - start >= BURST_S and local.started >= 3  # noqa: E731
        burst = asyncio.create_task(paced(client, BURST_RPS, BURST_MAX_S, added, outcomes))
        await async_wait_for(lambda: view(lambda p: p["backends"] >= 4), 60, "hosts added")
        grown = time.monotonic() - start
        await burst
        quiet = asyncio.create_task(
            paced(client, TRICKLE_RPS, QUIET_MAX_S, lambda: local.stopped >= 2, outcomes)
        )
        try:
            await async_wait_for(
                lambda: view(lambda p: floor(p) and p["backends"] == 2 and local.stopped >= 2),
                QUIET_MAX_S, "the added hosts drained and stopped",
            )  # fmt: skip
        except AssertionError as exc:  # what the router and the executor showed last
            raise AssertionError(f"{exc}; router: {seen[-1][1]}; hosts: {local.events}") from None
        shrunk = time.monotonic() - start
        await quiet
        await asyncio.gather(*list(outcomes.pending))
        await client.close()
        whats = [what for _, _, what in local.events]
        drained = [what for what in whats if what.startswith("drained")]
        started, stopped = local.started, local.stopped
    peak = max(p["backends"] for _, p in seen)
    print(f"\nautoscale live: {outcomes.sent} requests sent, {len(outcomes.errors)} failed; "
          f"hosts started {started}, drained {len(drained)}, stopped {stopped}; router's "
          f"backends peaked at {peak}, grown {grown:.1f} s and back {shrunk:.1f} s after "
          "the burst began")  # fmt: skip
    assert outcomes.errors == [] and outcomes.ok == outcomes.sent >= BURST_RPS * BURST_S
    assert peak >= 4 and started >= 3  # the initial host, its standby and more
    assert drained and stopped >= 2 and "activated" in whats  # the standby went in first
