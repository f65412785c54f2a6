"""`gpuroute demo --global`: the three regions of regions.example.toml on one machine.

Per region: simulated GPU hosts and a regional router that streams region reports; in
front, the global tier with residency rules. Clients near each region (a region hint
stands in for GeoIP here), an EU-bound tenant, then an eu-west outage and its recovery.
Prints where every phase's requests went and what residency did."""

from __future__ import annotations

import asyncio
import ssl
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
from gpuroute.testbed.certs import LocalCA
from gpuroute.testbed.fleet_host import start_fleet_host
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK, ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, StartError, spawn, wait_http
from rich.console import Console
from rich.table import Table

from gpuroute.auth import key_digest
from gpuroute.regions import load_fleet

MODEL = "llama-3.1-8b"
DEMO_KEY, DECISION_KEY = "sk-gpuroute-demo", "the-global-tier-signs-with-this"
REGIONS = {"us-east": "H100,A100", "eu-west": "A100,L4", "ap-northeast": "L4,L4"}
CLIENTS = (("us-east", {}), ("eu-west", {}), ("ap-northeast", {}),
           ("eu-west", {"x-gpuroute-residency": "eu"}))  # fmt: skip


def secure_router(ca: LocalCA, region: str, admin: int) -> str:
    """Security on: TLS with client certificates on the API and the region reports, keys
    required, and only requests the global tier signed a residency decision for."""
    return (
        f"[listen.tls]\n{ca.server_section(f'router-{region}')}"
        f"[admin_listen]\nport = {admin}\n"
        f"[region.report_listen.tls]\n{ca.server_section(f'report-{region}')}"
        f'[auth]\n[[auth.keys]]\nsha256 = "{key_digest(DEMO_KEY)}"\ntenant = "demo"\n'
    )


def start_region(
    workdir: Path, region: str, gpus: str, ca: LocalCA | None = None, jurisdiction: str = ""
) -> tuple[Child, Child, int]:
    hosts, fleet = start_fleet_host(workdir, f"hosts-{region}", 2, gpus)
    port, report, admin = free_port(), free_port(), free_port()
    top = "tick_s = 0.1\n" if ca else ROUTER_ON_LOOPBACK + "tick_s = 0.1\n"
    text = (top + f'[listen]\nport = {port}\n[region]\nname = "{region}"\n'
            f"report_period_s = 0.2\n[region.report_listen]\nport = {report}\n")  # fmt: skip
    if ca is not None:
        text = text.replace(
            "report_period_s = 0.2\n",
            f'report_period_s = 0.2\ndecision_key = "{DECISION_KEY}"\n'
            f'jurisdiction = "{jurisdiction}"\n'
            "require_global_decision = true\n",
        ) + secure_router(ca, region, admin)
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
    health = f"http://127.0.0.1:{admin if ca else port}/healthz"
    wait_http(health, 30, router, f"{region} router")
    return hosts, router, report


def global_toml(
    regions_file: Path,
    routers: dict[str, tuple[int, int]],
    port: int,
    ca: LocalCA | None = None,
    admin: int = 0,
) -> str:
    text = (
        ("" if ca else GLOBAL_ON_LOOPBACK) + f'regions_file = "{regions_file}"\ntick_s = 0.1\n'
        f"[listen]\nport = {port}\n"
        "[region_health]\nstale_after_s = 1.0\nup_after_s = 2.0\n"
        '[residency]\ntenants = { acme-eu = ["eu"] }\ncountries = { DE = ["eu"], FR = ["eu"] }\n'
    )
    scheme = "http"
    if ca is not None:  # keys, a signed decision for every region, mutual TLS to the routers
        scheme = "https"
        cert, key = ca.issue("global-tier")
        text += (
            f'decision_key = "{DECISION_KEY}"\n'
            f'api_keys = {{ "{key_digest(DEMO_KEY)}" = "demo" }}\n'
            f'[listen.tls]\ncert_file = "{cert}"\nkey_file = "{key}"\n'
            f"[admin_listen]\nport = {admin}\n"
            f"[router_tls]\n{ca.client_section('global-to-routers')}"
            f"[report_tls]\n{ca.client_section('global-reports')}"
        )
    for region, (api, report) in routers.items():
        text += f'[[endpoints]]\nregion = "{region}"\nurl = "{scheme}://127.0.0.1:{api}"\n'
        text += f'report = "127.0.0.1:{report}"\n'
    return text


async def phase(
    session: aiohttp.ClientSession, url: str, seconds: float, table: Table, title: str
) -> None:
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

    await asyncio.gather(*(client(session, home, h) for home, h in CLIENTS))
    where = ", ".join(f"{r} {n}" for (s, r), n in sorted(served.items()) if s == 200)
    refused = sum(n for (s, _), n in served.items() if s != 200)
    table.add_row(title, where, str(refused), str(violations))


async def drive(
    console: Console, url: str, children: dict, seconds: float, ca: LocalCA | None
) -> None:
    """Clients through the three phases; with `ca`, over TLS and with the demo's key."""
    context = None if ca is None else ssl.create_default_context(cafile=str(ca.ca_file))
    headers = {} if ca is None else {"Authorization": f"bearer {DEMO_KEY}"}
    connector = aiohttp.TCPConnector(ssl=context if context else True)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        await _phases(console, session, url, children, seconds)


async def _phases(
    console: Console, session: aiohttp.ClientSession, url: str, children: dict, seconds: float
) -> None:
    table = Table(title="global tier: where requests went", title_justify="left")
    for col in ("phase", "served by region (200s)", "refused (503)", "residency violations"):
        table.add_column(col)
    await phase(session, url, seconds, table, "3 regions up")
    console.print("[bold]eu-west goes down[/] (its router is killed)")
    children["eu-west"].kill()
    await phase(session, url, seconds, table, "eu-west down")
    console.print("[bold]eu-west comes back[/]")
    children["eu-west"].proc = spawn(
        "router-eu-west-2",
        [sys.executable, "-m", "gpuroute.cli", "router", "--config", "router-eu-west.toml"],
        children["eu-west"].log.parent,
        0,
    ).proc
    await asyncio.sleep(3.0)  # start-up plus the region's 2 s probation: the demo's timeline
    await phase(session, url, seconds, table, "eu-west back")
    console.print(table)


def run_global_demo(seconds: float = 5.0, secure: bool = False, port: int | None = None) -> int:
    """`secure`: every tier with TLS and mutual TLS, keys and signed residency decisions."""
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
        ca = LocalCA(workdir) if secure else None
        places = {r.name: r.jurisdiction for r in load_fleet(regions_file).regions}
        for region, gpus in REGIONS.items():
            hosts, router, report = start_region(workdir, region, gpus, ca, places[region])
            children += [hosts, router]
            routers[region] = (router.port, report)
            router_children[region] = router
            console.print(f"{region}: 2 simulated GPU hosts ({gpus}), router on :{router.port}")
        port, admin = port or free_port(), free_port()
        (workdir / "global.toml").write_text(global_toml(regions_file, routers, port, ca, admin))
        glob = spawn(
            "global",
            [sys.executable, "-m", "gpuroute.cli", "global", "--config", "global.toml"],
            workdir,
            port,
        )
        children.append(glob)
        wait_http(f"http://127.0.0.1:{admin if ca else port}/readyz", 30, glob, "global")
        url = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
        security = "; TLS, mutual TLS between tiers, keys, signed residency" if ca else ""
        console.print(f"global tier on {url} (EU-bound clients must stay in the EU{security})\n")
        asyncio.run(drive(console, url, router_children, seconds, ca))
        console.print(f"(logs in {workdir})")
        return 0
    except StartError as exc:
        console.print(f"[red]demo: {exc}[/]")
        return 1
    finally:
        for child in reversed(children):
            child.stop()
