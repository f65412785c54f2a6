"""A real Consul cluster over network namespaces: 3 servers and 3 GPU hosts (client agent,
fake engine, gpuroute agent), each its own namespace; the router in the root namespace.

One host is killed whole (every process, SIGKILL) and another is cut off (its link taken
down). Consul's gossip takes seconds to call them; the router must stop routing to them,
without a single failed non-streamed client request, and the times are printed."""

from __future__ import annotations

import sys
import time

import aiohttp
import pytest
from gpuroute.testbed.consul_dev import consul_binary
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from support.clients import Clients
from support.live import MODEL, async_wait_for, backends_state, get_json, holds, running_router
from support.netns import Host, NetnsLab

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
SERVERS = ("s1", "s2", "s3")
HOSTS = ("h1", "h2", "h3")
LOAD_TOKEN = "netns-lab-load-stream-token"  # load streams off loopback need one


def consul_cmd(lab: NetnsLab, host: Host, *, server: bool) -> list[str]:
    servers = [lab.hosts[s].ip for s in SERVERS]
    cmd = [
        str(consul_binary()), "agent", "-node", host.name, "-bind", host.ip,
        "-client", f"127.0.0.1 {host.ip}", "-data-dir", str(lab.workdir / f"consul-{host.name}"),
        "-dns-port", "-1", "-grpc-port", "-1", "-log-level", "warn",
        "-hcl", "performance { raft_multiplier = 1 }",
    ]  # fmt: skip
    for ip in servers:
        if ip != host.ip:
            cmd += ["-retry-join", ip]
    if server:
        cmd += ["-server", "-bootstrap-expect", "3"]
    return cmd


def start_host(lab: NetnsLab, host: Host) -> None:
    lab.popen(host, consul_cmd(lab, host, server=False), f"consul-{host.name}")
    lab.popen(
        host,
        [sys.executable, "-m", "gpuroute.cli", "fake-engine", "--host", "0.0.0.0", "--port",
         "8000", "--gpu", "H100"],
        f"engine-{host.name}",
    )  # fmt: skip
    config = lab.workdir / f"agent-{host.name}.toml"
    config.write_text(
        f'id = "{host.name}"\nadvertise_address = "{host.ip}"\ndrain_grace_s = 0.5\n'
        f'[engine]\nurl = "http://127.0.0.1:8000"\nmodels = ["{MODEL}"]\ngpu = "H100"\n'
        '[telemetry]\nsource = "simulated"\nhealth_interval_s = 0.2\n'
        '[consul]\naddress = "http://127.0.0.1:8500"\nttl_s = 6\n'
        f'[load_stream]\nhost = "0.0.0.0"\nport = 7070\ntoken = "{LOAD_TOKEN}"\n'
        "[admin]\nport = 7071\n"
    )
    lab.popen(
        host,
        [sys.executable, "-m", "gpuroute.cli", "agent", "--config", str(config)],
        f"agent-{host.name}",
    )


async def test_host_crash_and_partition_leave_rotation_without_failed_requests(lab) -> None:
    for name in SERVERS + HOSTS:
        lab.add_host(name)
    for name in SERVERS:
        lab.popen(lab.hosts[name], consul_cmd(lab, lab.hosts[name], server=True), f"consul-{name}")
    consul = f"http://{lab.hosts['s1'].ip}:8500"
    await async_wait_for(
        holds(lambda: bool(get_json(consul + "/v1/status/leader"))), 60, "a Consul leader"
    )
    for name in HOSTS:
        start_host(lab, lab.hosts[name])
    await async_wait_for(
        holds(lambda: len(get_json(consul + "/v1/health/service/gpuroute-engine?passing=1") or [])
              == 3), 60, "3 passing engines",
    )  # fmt: skip
    # least work, not the default slo_aware: with two of three hosts gone on a loaded CI
    # machine, SLO admission shed one request with 429 (make test, 2026-11-30); what is
    # under test here is rotation, and any request lost to it still fails the test
    router_toml = (
        ROUTER_ON_LOOPBACK
        + 'policy = "least_outstanding_work"\n'
        + f'tick_s = 0.05\n[listen]\nport = 0\n[membership]\nconsul = "{consul}"\nwait_s = 5\n'
        + f'load_stream_token = "{LOAD_TOKEN}"\n'
    )
    async with running_router(router_toml, lab.workdir) as (url, router):
        async with aiohttp.ClientSession() as s:
            for name in HOSTS:
                await async_wait_for(lambda n=name: _routable(s, url, n), 30, f"{name} routable")
            async with Clients(url, workers=8) as clients:
                await async_wait_for(
                    holds(lambda: all(clients.first_to(n) for n in HOSTS)), 20, "traffic to all"
                )
                times = {}
                killed = time.monotonic()
                lab.kill_host(lab.hosts["h2"])
                times["crash: out of rotation"] = await _until(
                    lambda: _not_routable(s, url, "h2"), killed, 30
                )
                times["crash: Consul critical"] = await _until(
                    lambda: _consul_says(s, url, "h2", "critical"), killed, 60
                )
                cut = time.monotonic()
                lab.cut(lab.hosts["h1"])
                times["partition: out of rotation"] = await _until(
                    lambda: _not_routable(s, url, "h1"), cut, 60
                )
                times["partition: Consul critical"] = await _until(
                    lambda: _consul_says(s, url, "h1", "critical"), cut, 60
                )
                settle = len(clients.results)
                await async_wait_for(
                    holds(lambda: len(clients.results) > settle + 20), 30, "traffic on h3 alone"
                )
            rows = await backends_state(s, url)
    print("\n" + "\n".join(f"{k}: {v:.2f} s" for k, v in times.items()))
    print(f"requests {len(clients.results)}, failed {len(clients.failed)}, "
          f"rescued {router.watch.rescues}")  # fmt: skip
    assert clients.failed == []
    assert rows["h3"]["state"] in ("ready", "warming")
    assert {rows["h1"]["state"], rows["h2"]["state"]} <= {"draining", "ejected"}


# -- helpers ------------------------------------------------------------------------------------


async def _until(condition, since: float, timeout: float) -> float:
    await async_wait_for(condition, timeout, "the router to react")
    return time.monotonic() - since


async def _routable(session, url: str, backend: str) -> bool:
    row = (await backends_state(session, url)).get(backend)
    return row is not None and row["state"] in ("ready", "warming")


async def _not_routable(session, url: str, backend: str) -> bool:
    return not await _routable(session, url, backend)


async def _consul_says(session, url: str, backend: str, status: str) -> bool:
    row = (await backends_state(session, url)).get(backend)
    return row is not None and (row.get("consul") or {}).get("status") == status
