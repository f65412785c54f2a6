"""`gpuroute demo --global`: the three regions of regions.example.toml on one machine.

Per region: simulated GPU hosts and a regional router that streams region reports; in
front, the global tier with residency rules. Clients near each region (a region hint
stands in for GeoIP here), an EU-bound tenant, then an eu-west outage and its recovery.
Prints where every phase's requests went and what residency did."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
from gpuroute.testbed.fleet_host import start_fleet_host
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK, ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, StartError, spawn, wait_http
from rich.console import Console
from rich.table import Table

MODEL = "llama-3.1-8b"
REGIONS = {"us-east": "H100,A100", "eu-west": "A100,L4", "ap-northeast": "L4,L4"}
CLIENTS = (("us-east", {}), ("eu-west", {}), ("ap-northeast", {}),
           ("eu-west", {"x-gpuroute-residency": "eu"}))  # fmt: skip


def start_region(workdir: Path, region: str, gpus: str) -> tuple[Child, Child, int]:
    hosts, fleet = start_fleet_host(workdir, f"hosts-{region}", 2, gpus)
    port, report = free_port(), free_port()
    text = (ROUTER_ON_LOOPBACK + f'tick_s = 0.1\n[listen]\nport = {port}\n'
            f'[region]\nname = "{region}"\n'
            f"report_period_s = 0.2\n[region.report_listen]\nport = {report}\n")  # fmt: skip
    for h in fleet:
        text += f'[[backends]]\nid = "{h["id"]}"\nurl = "{h["engine"]}"\ngpu = "{h["gpu"]}"\n'
        text += f'models = ["{MODEL}"]\n'
    (workdir / f"router-{region}.toml").write_text(text)
    router = spawn(
        f"router-{region}",
        [sys.executable, "-m", "gpuroute.cli", "router", "--config", f"router-{region}.toml"],
        workdir,
        port,
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", 30, router.proc, f"{region} router")
    return hosts, router, report


def global_toml(regions_file: Path, routers: dict[str, tuple[int, int]], port: int) -> str:
    text = (
        GLOBAL_ON_LOOPBACK + f'regions_file = "{regions_file}"\ntick_s = 0.1\n'
        f"[listen]\nport = {port}\n"
        "[region_health]\nstale_after_s = 1.0\nup_after_s = 2.0\n"
        '[residency]\ntenants = { acme-eu = ["eu"] }\ncountries = { DE = ["eu"], FR = ["eu"] }\n'
    )
    for region, (api, report) in routers.items():
        text += f'[[endpoints]]\nregion = "{region}"\nurl = "http://127.0.0.1:{api}"\n'
        text += f'report = "127.0.0.1:{report}"\n'
    return text


async def phase(url: str, seconds: float, table: Table, title: str) -> None:
    served: Counter[tuple[int, str]] = Counter()
    outcomes: Counter[str] = Counter()
    violations = 0

    async def client(session: aiohttp.ClientSession, home: str, headers: dict) -> None:
        nonlocal violations
        deadline = time.monotonic() + seconds
        body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        while time.monotonic() < deadline:
            h = {"x-gpuroute-region": home, **headers}
            async with session.post(url + "/v1/chat/completions", json=body, headers=h) as r:
                await r.read()
                region = r.headers.get("x-gpuroute-region", "-")
            kind = "EU-bound" if headers else f"near {home}"
            served[(r.status, region)] += 1
            outcomes[f"{kind}: {r.status}"] += 1
            if headers and r.status == 200 and region != "eu-west":
                violations += 1
            if r.status != 200:
                await asyncio.sleep(0.05)  # a refused client backs off a little

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session, home, h) for home, h in CLIENTS))
    where = ", ".join(f"{r} {n}" for (s, r), n in sorted(served.items()) if s == 200)
    refused = sum(n for (s, _), n in served.items() if s != 200)
    table.add_row(title, where, str(refused), str(violations))


async def drive(console: Console, url: str, routers: dict, children: dict, seconds: float) -> None:
    table = Table(title="global tier: where requests went", title_justify="left")
    for col in ("phase", "served by region (200s)", "refused (503)", "residency violations"):
        table.add_column(col)
    await phase(url, seconds, table, "3 regions up")
    console.print("[bold]eu-west goes down[/] (its router is killed)")
    children["eu-west"].kill()
    await phase(url, seconds, table, "eu-west down")
    console.print("[bold]eu-west comes back[/]")
    children["eu-west"].proc = spawn(
        "router-eu-west-2",
        [sys.executable, "-m", "gpuroute.cli", "router", "--config", "router-eu-west.toml"],
        children["eu-west"].log.parent,
        0,
    ).proc
    await asyncio.sleep(3.0)  # start-up plus the region's 2 s probation: the demo's timeline
    await phase(url, seconds, table, "eu-west back")
    console.print(table)


def run_global_demo(seconds: float = 5.0) -> int:
    console = Console(width=None if sys.stdout.isatty() else 150)
    workdir = Path(tempfile.mkdtemp(prefix="gpuroute-global-demo-"))
    regions_file = Path(__file__).resolve().parent.parent / "regions.example.toml"
    if not regions_file.exists():
        console.print("[red]demo --global runs from a checkout (it reads regions.example.toml)[/]")
        return 1
    children: list[Child] = []
    routers: dict[str, tuple[int, int]] = {}
    router_children: dict[str, Child] = {}
    try:
        for region, gpus in REGIONS.items():
            hosts, router, report = start_region(workdir, region, gpus)
            children += [hosts, router]
            routers[region] = (router.port, report)
            router_children[region] = router
            console.print(f"{region}: 2 simulated GPU hosts ({gpus}), router on :{router.port}")
        port = free_port()
        (workdir / "global.toml").write_text(global_toml(regions_file, routers, port))
        glob = spawn(
            "global",
            [sys.executable, "-m", "gpuroute.cli", "global", "--config", "global.toml"],
            workdir,
            port,
        )
        children.append(glob)
        wait_http(f"http://127.0.0.1:{port}/readyz", 30, glob.proc, "global router")
        console.print(
            f"global tier on http://127.0.0.1:{port} (EU-bound clients must stay in the EU)\n"
        )
        asyncio.run(drive(console, f"http://127.0.0.1:{port}", routers, router_children, seconds))
        console.print(f"(logs in {workdir})")
        return 0
    except StartError as exc:
        console.print(f"[red]demo: {exc}[/]")
        return 1
    finally:
        for child in reversed(children):
            child.stop()
