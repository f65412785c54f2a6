"""`gpuroute bench replicas`: router replicas in front of a Consul-discovered fleet.

Every replica discovers the engines through Consul and reads the same agent load reports,
a shared and slightly stale signal: exactly where independent replicas herd onto the engine
that looks idle to all of them at once. The same trace is replayed round robin over the
replicas twice, with state shared through Redis and without; the ratio of the two is the
result (same machine, same run)."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from gpuroute.bench.live import LiveBenchSpec, load_workload
from gpuroute.bench.live_stats import MODEL, engine_stats, summarise
from gpuroute.bench.loadgen import Replay
from gpuroute.bench.targets import BenchError
from gpuroute.testbed.consul_dev import HOW_TO_GET_CONSUL, ConsulDev, consul_binary
from gpuroute.testbed.fleet_host import start_fleet_host
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, spawn, start_redis, wait_http


@dataclass(frozen=True)
class EngineUrl:
    url: str


def router_toml(port: int, consul: str, redis_url: str | None) -> str:
    text = (
        ROUTER_ON_LOOPBACK + "tick_s = 0.1\n"
        f"[listen]\nport = {port}\n[limits]\nfirst_byte_timeout_s = 900.0\n"
        "max_connections_per_ip = 65536\n"
        f'[membership]\nconsul = "{consul}"\n'
    )
    if redis_url:
        text += f'[redis]\nurl = "{redis_url}"\n'
    return text


async def all_routable(urls: list[str], n: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        for url in urls:
            while True:
                try:
                    async with s.get(url + "/admin/backends") as r:
                        rows = (await r.json())["backends"]
                    fresh = [b for b in rows if b["state"] in ("ready", "warming")
                             and (b.get("agent") or {}).get("fresh")]  # fmt: skip
                    if len(fresh) == n:
                        break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise BenchError(f"{url}: not all {n} backends routable with fresh agents")
                await asyncio.sleep(0.2)


def run_once(spec: LiveBenchSpec, shared: bool, workdir: Path) -> dict:
    binary = consul_binary()
    if binary is None:
        raise BenchError(HOW_TO_GET_CONSUL)
    workdir.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []
    with ConsulDev(binary, log_path=workdir / "consul.log") as consul:
        try:
            hosts, fleet = start_fleet_host(
                workdir, "fleet-hosts", len(spec.engines), ",".join(spec.engines),
                consul=consul.address, time_scale=spec.time_scale,
            )  # fmt: skip
            children.append(hosts)
            redis_url = None
            if shared:
                redis = start_redis(workdir)
                children.append(redis)
                redis_url = f"redis://127.0.0.1:{redis.port}/0"
            urls = []
            for k in range(spec.replicas):
                port = free_port()
                (workdir / f"replica-{k}.toml").write_text(
                    router_toml(port, consul.address, redis_url)
                )
                cmd = [
                    sys.executable,
                    "-m",
                    "gpuroute.cli",
                    "router",
                    "--config",
                    f"replica-{k}.toml",
                ]
                child = spawn(f"replica-{k}", cmd, workdir, port)
                children.append(child)
                wait_http(child.url + "/healthz", 30, child, child.name)
                urls.append(child.url)
            asyncio.run(all_routable(urls, len(fleet)))
            workload, _rate = load_workload(spec)
            replay = Replay(urls, workload, MODEL, stream=spec.stream)
            results = asyncio.run(replay.run())
            name = f"{spec.replicas} replicas, {'shared state' if shared else 'independent'}"
            summary = summarise(name, results, spec, workload)
            engines = [EngineUrl(h["engine"]) for h in fleet]
            summary |= asyncio.run(engine_stats(engines, replay.elapsed()))
            return summary
        finally:
            for child in reversed(children):
                child.stop()


def run_replicas_bench(spec: LiveBenchSpec, workdir: Path, modes=(False, True)) -> dict:
    workdir = workdir.resolve()
    rows = [run_once(spec, shared, workdir / ("shared" if shared else "independent"))
            for shared in modes]  # fmt: skip
    report = {"replicas": spec.replicas, "engines": spec.engines, "targets": rows}
    if len(rows) == 2:
        report["p99_independent_over_shared"] = round(
            rows[0]["e2e_p99_s"] / rows[1]["e2e_p99_s"], 3
        )
    return report
