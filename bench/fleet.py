"""`gpuroute bench fleet`: a Consul-discovered fleet of simulated hosts behind one router.

Measures what the membership design promises (DESIGN.md, principle 3):
- load-signal staleness at the router: the age of the freshest agent report it holds, sampled
  for every backend every 100 ms from /admin/backends while traffic flows;
- Consul's Raft write rate from steady agents (the server's raft last_log_index over time);
- a Consul outage: Consul killed for `outage_s`, then restarted empty: failed client requests,
  and how long the router takes to catch up by itself."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from gpuroute.bench.targets import BenchError
from gpuroute.testbed.consul_dev import HOW_TO_GET_CONSUL, ConsulDev, consul_binary
from gpuroute.testbed.fleet_host import start_fleet_host
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, spawn, wait_http

from gpuroute.stats import percentile

MODEL = "llama-3.1-8b"


@dataclass
class FleetBenchSpec:
    hosts: int = 50
    duration_s: float = 60.0
    outage_s: float = 30.0
    workers: int = 8
    time_scale: float = 2.0
    workdir: Path = field(default_factory=lambda: Path("out/bench-fleet"))


def passing_count(consul: ConsulDev) -> int:
    url = consul.address + "/v1/health/service/gpuroute-engine?passing=1"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return len(json.load(r))
    except OSError:
        return 0


class Traffic:
    """Closed-loop clients; every outcome counted."""

    def __init__(self, url: str, workers: int) -> None:
        self.url, self.workers = url, workers
        self.ok = self.failed = 0
        self.stop = asyncio.Event()
        self.errors: dict[str, int] = {}

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._worker(session) for _ in range(self.workers)))

    async def _worker(self, session: aiohttp.ClientSession) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 40}],
                "max_tokens": 16}  # fmt: skip
        while not self.stop.is_set():
            try:
                async with session.post(self.url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    if r.status == 200:
                        self.ok += 1
                        continue
                    key = f"HTTP {r.status}"
            except aiohttp.ClientError as exc:
                key = type(exc).__name__
            self.failed += 1
            self.errors[key] = self.errors.get(key, 0) + 1


async def admin(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/admin/backends") as r:
        return await r.json()


async def wait_until(predicate, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not await predicate():
        if time.monotonic() - started > timeout:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def measure(spec: FleetBenchSpec, consul: ConsulDev, router_url: str) -> dict:
    n = spec.hosts
    async with aiohttp.ClientSession() as s:

        async def all_routable() -> bool:
            body = await admin(s, router_url)
            rows = [b for b in body["backends"] if b["state"] in ("ready", "warming")]
            return len(rows) == n and not body["membership"]["stale"]

        await wait_until(all_routable, 120, f"{n} routable backends")
        traffic = Traffic(router_url, spec.workers)
        driver = asyncio.create_task(traffic.run())
        await asyncio.sleep(3.0)  # settle: first streams, warm-ups; not a synchronisation
        ages: list[float] = []
        index0, t0 = consul.raft_index(), time.monotonic()
        while time.monotonic() - t0 < spec.duration_s:
            body = await admin(s, router_url)
            ages += [b["agent"]["age_s"] for b in body["backends"] if b.get("agent")]
            await asyncio.sleep(0.1)  # the sampling period
        index1, t1 = consul.raft_index(), time.monotonic()
        steady = {"requests_ok": traffic.ok, "requests_failed": traffic.failed}
        result: dict = {
            "hosts": n,
            "staleness_samples": len(ages),
            "staleness_p50_s": percentile(ages, 50),
            "staleness_p99_s": percentile(ages, 99),
            "staleness_max_s": float(np.max(ages)),
            "raft_writes": index1 - index0,
            "raft_writes_per_s": (index1 - index0) / (t1 - t0),
            "steady_seconds": t1 - t0,
            "steady": steady,
        }
        if spec.outage_s > 0:
            ok0, failed0 = traffic.ok, traffic.failed
            consul.stop()
            await asyncio.sleep(spec.outage_s)  # the outage itself
            served_during = traffic.ok - ok0
            await asyncio.to_thread(consul.start)
            back = time.monotonic()
            await wait_until(all_routable, 120, "router caught up")
            router_s = time.monotonic() - back

            async def registered() -> bool:
                return passing_count(consul) == n

            await wait_until(registered, 120, "agents registered again")
            result["outage"] = {
                "seconds": spec.outage_s,
                "served_during": served_during,
                "failed": traffic.failed - failed0,
                "router_recovered_s": router_s,
                "agents_registered_s": time.monotonic() - back,
            }
        traffic.stop.set()
        await driver
        result["requests_ok"], result["requests_failed"] = traffic.ok, traffic.failed
        result["errors"] = traffic.errors
        return result


def run_fleet_bench(spec: FleetBenchSpec) -> dict:
    binary = consul_binary()
    if binary is None:
        raise BenchError(HOW_TO_GET_CONSUL)
    spec.workdir = spec.workdir.resolve()
    spec.workdir.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []
    with ConsulDev(binary, log_path=spec.workdir / "consul.log") as consul:
        try:
            hosts, _ = start_fleet_host(
                spec.workdir, "fleet-hosts", spec.hosts, "H100,A100,L4",
                consul=consul.address, time_scale=spec.time_scale, timeout=180,
            )  # fmt: skip
            children.append(hosts)
            port = free_port()
            config = spec.workdir / "router.toml"
            config.write_text(
                ROUTER_ON_LOOPBACK + "tick_s = 0.1\n"
                f"[listen]\nport = {port}\n[limits]\nmax_connections_per_ip = 65536\n"
                f'[membership]\nconsul = "{consul.address}"\n'
            )
            cmd = [sys.executable, "-m", "gpuroute.cli", "router", "--config", str(config)]
            router = spawn("router", cmd, spec.workdir, port)
            children.append(router)
            wait_http(f"http://127.0.0.1:{port}/healthz", 30, router, "router")
            return asyncio.run(measure(spec, consul, f"http://127.0.0.1:{port}"))
        finally:
            for child in reversed(children):
                child.stop()
