"""The local executor (testbed/local_scaler.py) against a real Consul: hosts (a fake engine
and its real agent, each a process) boot after their delay and register, standby hosts go
into service before new ones boot, surplus standby stops at once, an active host refills a
short standby, surplus active hosts are drained before they stop and deregister, and
`max_hosts` bounds them all."""

from __future__ import annotations

import json
import urllib.request

import pytest
from gpuroute.router.core.scale_targets import PoolTarget
from gpuroute.testbed.local_scaler import LocalFleet, LocalFleetSettings
from support.live import async_wait_for, holds

pytestmark = pytest.mark.asyncio
POOL = "llama-3.1-8b"


def registered(consul: str) -> dict[str, dict]:
    """Every gpuroute-engine instance in Consul: id -> its Meta and whether it passes."""
    url = f"{consul}/v1/health/service/gpuroute-engine"
    with urllib.request.urlopen(url, timeout=5) as response:
        entries = json.load(response)
    return {
        e["Service"]["ID"]: {
            "meta": e["Service"]["Meta"] or {},
            "passing": all(c["Status"] == "passing" for c in e["Checks"]),
        }
        for e in entries
    }


def fleet(consul, tmp_path, **settings) -> LocalFleet:
    defaults = {"boot_delay_s": 0.3, "max_hosts": 3, "follow_every_s": 0.2}
    return LocalFleet(
        LocalFleetSettings(consul=consul.address, workdir=tmp_path, **(defaults | settings))
    )


async def test_hosts_boot_register_then_drain_and_deregister(consul, tmp_path) -> None:
    local = fleet(consul, tmp_path)
    await local.start()
    try:
        assert local.census(POOL)["active"] == 1 and local.started == 1
        await local.apply({POOL: PoolTarget(4, 0), "other-model": PoolTarget(9, 9)})
        assert local.census(POOL)["booting"] == 2  # max_hosts: 3 in all
        await async_wait_for(
            holds(lambda: local.census(POOL)["active"] == 3), 60, "two more hosts in service"
        )
        await async_wait_for(
            holds(lambda: sum(h["passing"] for h in registered(consul.address).values()) == 3),
            30, "three passing instances in Consul",
        )  # fmt: skip
        await local.apply({POOL: PoolTarget(1, 0)})
        assert local.census(POOL)["leaving"] == 2
        await async_wait_for(holds(lambda: len(local.hosts) == 1), 60, "two hosts stopped")
        await async_wait_for(
            holds(lambda: len(registered(consul.address)) == 1), 30, "two deregistered"
        )
        drained = [what for _, _, what in local.events if what.startswith("drained")]
        assert len(drained) == 2 and local.stopped == 2
    finally:
        await local.close()
    assert local.hosts == [] and registered(consul.address) == {}


async def test_a_boot_cancelled_before_it_is_ready_starts_nothing(consul, tmp_path) -> None:
    local = fleet(consul, tmp_path, boot_delay_s=30, initial_hosts=0)
    await local.start()
    try:
        await local.apply({POOL: PoolTarget(2, 0)})
        assert local.census(POOL)["booting"] == 2
        await local.apply({POOL: PoolTarget(1, 0)})
        assert local.census(POOL)["booting"] == 1
        assert [what for _, _, what in local.events] == ["booting", "booting", "boot cancelled"]
    finally:
        await local.close()
    assert local.started == 0 and local.hosts == []


async def test_standby_goes_into_service_first_and_surplus_standby_stops(consul, tmp_path) -> None:
    local = fleet(consul, tmp_path, max_hosts=4)
    await local.start()
    try:
        await local.apply({POOL: PoolTarget(1, 1)})
        await async_wait_for(holds(lambda: local.census(POOL)["standby"] == 1), 60, "standby up")
        await async_wait_for(
            holds(lambda: sum(h["meta"].get("standby") == "true"
                              for h in registered(consul.address).values()) == 1),
            30, "one standby instance in Consul",
        )  # fmt: skip
        await local.apply({POOL: PoolTarget(2, 1)})
        assert local.census(POOL)["active"] == 2  # the standby host went in at once
        assert local.census(POOL)["booting"] == 1  # and a new standby boots
        await async_wait_for(holds(lambda: local.census(POOL)["standby"] == 1), 60, "new standby")
        await local.apply({POOL: PoolTarget(2, 0)})
        assert local.census(POOL)["standby"] == 0 and local.census(POOL)["leaving"] == 1
        await async_wait_for(holds(lambda: len(local.hosts) == 2), 60, "standby stopped")
        await local.apply({POOL: PoolTarget(1, 1)})  # an active host refills the standby
        assert local.census(POOL) | {"leaving": 0} == {
            "booting": 0,
            "active": 1,
            "standby": 1,
            "leaving": 0,
        }
        await async_wait_for(
            holds(lambda: sum(h["meta"].get("standby") == "true"
                              for h in registered(consul.address).values()) == 1),
            30, "the host back in standby in Consul",
        )  # fmt: skip
        whats = [what for _, _, what in local.events]
        assert "activated" in whats and "back to standby" in whats
    finally:
        await local.close()
