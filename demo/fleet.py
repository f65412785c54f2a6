"""`gpuroute demo`: a one-machine fleet that shows the live pieces working together.

Simulated GPU hosts (fake engines with their node agents), a `consul agent -dev` when the
pinned Consul binary is available (static membership otherwise), one regional router, and
traffic through it. Halfway, one host drains. Prints the backends as the router sees them
(state, Consul status, agent load), where the requests went, and why (demo/placement.py:
each share beside the latency predicted and measured there)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from gpuroute.demo.placement import (
    MODEL,
    TYPICAL_OUTPUT,
    TYPICAL_WORDS,
    Placement,
    chat,
    timed_stream,
)
from gpuroute.testbed.consul_dev import HOW_TO_GET_CONSUL, ConsulDev, consul_binary
from gpuroute.testbed.fleet_host import start_fleet_host
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, StartError, spawn, wait_http
from rich.console import Console
from rich.table import Table

GPUS = "H100,A100,L4,L4"


def router_toml(port: int, consul: str | None, hosts: list[dict]) -> str:
    text = ROUTER_ON_LOOPBACK + f"tick_s = 0.1\n[listen]\nport = {port}\n"
    if consul:
        return text + f'[membership]\nconsul = "{consul}"\n'
    for h in hosts:
        text += f'[[backends]]\nid = "{h["id"]}"\nurl = "{h["engine"]}"\ngpu = "{h["gpu"]}"\n'
        text += f'models = ["{MODEL}"]\n'
    return text


async def traffic(
    url: str, seconds: float, workers: int, routed: dict, outcomes: dict, placement: Placement
) -> None:
    rng = random.Random(7)

    async def worker(session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            words = rng.choice((20, TYPICAL_WORDS, 2000))  # short chats to long documents
            body = chat(words, rng.choice((16, TYPICAL_OUTPUT, 128)))
            try:
                ok, ttft, e2e, backend = await timed_stream(session, url, body)
            except aiohttp.ClientError:
                ok, backend = False, "-"
            if ok:
                placement.record(backend, body, ttft, e2e)
            routed[backend] = routed.get(backend, 0) + 1
            outcomes["ok" if ok else "failed"] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(workers)))


def backends_table(body: dict, routed: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("backend", "GPU", "state", "reason", "Consul", "agent", "running",
                "waiting", "KV use", "GPU util", "routed"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("backend", "state", "reason") else "right")
    for b in body["backends"]:
        agent = b.get("agent") or {}
        table.add_row(
            b["id"], b["gpu"], b["state"], b["reason"], (b.get("consul") or {}).get("status", "-"),
            agent.get("health", "-"), str(agent.get("running", "-")),
            str(agent.get("waiting", "-")), f"{agent.get('kv_cache_usage', 0):.0%}",
            f"{agent.get('gpu_util', 0):.0%}", str(routed.get(b["id"], 0)),
        )  # fmt: skip
    return table


async def show(console: Console, router_url: str, routed: dict, title: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(router_url + "/admin/backends") as r:
        body = await r.json()
    console.print(backends_table(body, routed, title))


async def drive(console: Console, router_url: str, hosts: list[dict], seconds: float) -> dict:
    routed: dict[str, int] = {}
    outcomes = {"ok": 0, "failed": 0}
    placement = Placement()
    load = asyncio.create_task(traffic(router_url, seconds, 12, routed, outcomes, placement))
    polls = asyncio.create_task(placement.poll(router_url, load))
    await asyncio.sleep(seconds / 2)  # the demo's timeline, not a synchronisation
    await show(console, router_url, routed, f"after {seconds / 2:.0f} s of traffic")
    victim = await busiest(router_url, hosts)
    console.print(
        f"[bold]draining {victim['id']}[/], the host with the most requests in flight (what "
        "`gpuroute agent drain` does): they finish, nothing new goes there"
    )
    drain_url = f"http://127.0.0.1:{victim['admin_port']}/drain"
    async with aiohttp.ClientSession() as s, s.post(drain_url, json={}) as r:
        console.print(f"agent says: {await r.text()}")
    await load
    await polls
    await show(console, router_url, routed, f"after {seconds:.0f} s: traffic done")
    await placement.probe({h["id"]: h["engine"] for h in hosts})
    console.print(placement.table(routed))
    console.print(placement.why(routed))
    return outcomes


async def busiest(router_url: str, hosts: list[dict]) -> dict:
    """The host whose engine has the most requests in flight now (the router's view), so
    the drain has streams to finish; the last host when none has any."""
    async with aiohttp.ClientSession() as s, s.get(router_url + "/admin/backends") as r:
        rows = (await r.json())["backends"]
    in_flight = {row["id"]: row.get("in_flight", 0) for row in rows}  # (ids: the hosts')
    return max(reversed(hosts), key=lambda h: in_flight.get(h["id"], 0))


def run_demo(seconds: float = 16.0, port: int | None = None) -> int:
    console = Console(width=None if sys.stdout.isatty() else 150)
    workdir = Path(tempfile.mkdtemp(prefix="gpuroute-demo-"))
    binary = consul_binary()
    consul = ConsulDev(binary, log_path=workdir / "consul.log") if binary else None
    if consul is None:
        console.print(f"[yellow]{HOW_TO_GET_CONSUL}[/]; the demo uses static membership")
    children: list[Child] = []
    try:
        if consul:
            consul.start()
            console.print(f"Consul dev agent on {consul.address}")
        fleet, hosts = start_fleet_host(
            workdir, "hosts", 4, GPUS, consul=consul.address if consul else None
        )
        children.append(fleet)
        console.print(f"{len(hosts)} simulated GPU hosts with agents: "
                      + ", ".join(f"{h['id']}" for h in hosts))  # fmt: skip
        port = port or free_port()
        config = workdir / "router.toml"
        config.write_text(router_toml(port, consul.address if consul else None, hosts))
        cmd = [sys.executable, "-m", "gpuroute.cli", "router", "--config", str(config)]
        children.append(spawn("router", cmd, workdir, port))
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/readyz", 60, children[-1], "router")
        console.print(f"router on {url} ({'Consul' if consul else 'static'} membership)\n")
        outcomes = asyncio.run(drive(console, url, hosts, seconds))
        console.print(
            f"\n[bold]{outcomes['ok']} streamed requests completed, {outcomes['failed']} failed[/]"
            f" (logs in {workdir})"
        )
        return 0 if outcomes["failed"] == 0 else 1
    except StartError as exc:
        console.print(f"[red]demo: {exc}[/]")
        return 1
    finally:
        for child in reversed(children):
            child.stop()
        if consul:
            with contextlib.suppress(Exception):
                consul.stop()
