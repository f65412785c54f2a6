"""`gpuroute demo --autoscale`: a burst brings hosts in, a quiet spell drains them out.

A `consul agent -dev`; one router sizing its pool (`[autoscale]` with a small
`capacity_rps`, so that a modest burst needs more backends); `gpuroute scale`'s loop with
the local executor (testbed/local_scaler.py): hosts (a fake engine and its agent each) that
boot after a short delay, take standby first, drain before they stop. Traffic: a trickle,
a burst (longer where hosts come in late), a trickle again until the pool is back to its
floor. Prints the timeline as the
router and the executor saw it, then the requests sent and failed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from gpuroute.demo.placement import MODEL, chat, timed_stream
from gpuroute.router.scaling.scaler import RouterAdmin, Scaler
from gpuroute.testbed.consul_dev import HOW_TO_GET_CONSUL, ConsulDev, consul_binary
from gpuroute.testbed.local_scaler import LocalFleet, LocalFleetSettings
from gpuroute.testbed.loopback import consul_router_toml, quick_autoscale_toml
from gpuroute.testbed.ports import free_ports
from gpuroute.testbed.processes import Child, StartError, spawn, wait_http
from rich.console import Console
from rich.table import Table

# one backend serves 2 requests/s within the SLO (as `gpuroute plan` would measure it): a
# burst of 6/s needs 4 at the 80 % mark, the most the pool may have is 3 (+1 standby)
AUTOSCALE = quick_autoscale_toml(MODEL, capacity_rps=2.0, max_backends=4)
TRICKLE_RPS, BURST_RPS = 0.5, 6.0
LEAD_IN_S, QUIET_MAX_S = 4.0, 30.0
# the burst goes on past its length (at most this much) until the pool's most in rotation
# serve it: on a loaded machine hosts boot and register slower than the burst lasts
PEAK_IN_ROTATION, BURST_GRACE_S = 3, 30.0
SAMPLE_S = 2.0
BOOT_DELAY_S = 1.0  # a GPU host's boot and model load take minutes; the demo's, one second
FLOOR = (1, 1)  # min_backends in rotation, one standby


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    rows: list[tuple[str, ...]] = field(default_factory=list)
    sent: int = 0
    failed: int = 0
    hosts_started: int = 0  # by the executor, before it closed
    hosts_removed: int = 0  # drained (or standby) and stopped, before it closed
    pending: set[asyncio.Task] = field(default_factory=set)


async def send(session: aiohttp.ClientSession, url: str, timeline: Timeline) -> None:
    timeline.sent += 1
    try:
        ok, *_ = await timed_stream(session, url, chat(40, 24))
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    timeline.failed += not ok


async def paced(
    session: aiohttp.ClientSession, url: str, rate: float, until, timeline: Timeline
) -> None:
    """Open loop at `rate` until `until()` says stop (each request its own task)."""
    start, n = time.monotonic(), 0
    while not until():
        task = asyncio.create_task(send(session, url, timeline))
        timeline.pending.add(task)
        task.add_done_callback(timeline.pending.discard)
        n += 1
        await asyncio.sleep(max(start + n / rate - time.monotonic(), 0))  # the pace


async def sample(
    admin: aiohttp.ClientSession, admin_url: str, local: LocalFleet, timeline: Timeline
) -> tuple[int, int] | None:
    """One row of the timeline once the router has sized the pool; returns (in rotation,
    standby) as the router counts them."""
    async with admin.get(admin_url + "/admin/autoscale") as response:
        pool = (await response.json())["pools"].get(MODEL)
    if pool is None:
        return None
    hosts = local.census(MODEL)
    rotation, standby = pool["in_rotation"], pool["standby"]
    timeline.rows.append((
        f"{time.monotonic() - timeline.started:.0f} s", f"{pool['rate_rps']:.1f}",
        f"{pool['desired_backends']} + {pool['desired_standby_backends']}", str(rotation),
        str(standby), str(hosts["active"] + hosts["standby"] + hosts["leaving"]),
        str(hosts["booting"]), str(hosts["leaving"]),
    ))  # fmt: skip
    return rotation, standby


async def routable(session: aiohttp.ClientSession, router_url: str, timeout_s: float) -> None:
    """Until the router routes (its first host found in Consul and healthy)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(router_url + "/readyz") as response:
                if response.status == 200:
                    return
        if time.monotonic() > deadline:
            raise StartError(f"the router found no host within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)  # polling, bounded by the deadline


async def drive(
    router_url: str, admin_url: str, token: str, local: LocalFleet, burst_s: float
) -> Timeline:
    admin = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
    async with aiohttp.ClientSession() as session, admin:
        await routable(session, router_url, 60)
        timeline = Timeline()
        shape = {"phase": "lead-in", "at_floor": False, "peaked": False}

        async def watch() -> None:
            while shape["phase"] != "done":
                counts = await sample(admin, admin_url, local, timeline)
                shape["at_floor"] = counts == FLOOR
                shape["peaked"] = shape["peaked"] or (counts or (0,))[0] >= PEAK_IN_ROTATION
                await asyncio.sleep(SAMPLE_S)  # the timeline's period

        watcher = asyncio.create_task(watch())
        end = time.monotonic() + LEAD_IN_S
        await paced(session, router_url, TRICKLE_RPS, lambda: time.monotonic() > end, timeline)
        shape["phase"], shape["peaked"] = "burst", False
        end = time.monotonic() + burst_s

        def burst_over() -> bool:
            now = time.monotonic()
            return (now > end and shape["peaked"]) or now > end + BURST_GRACE_S

        await paced(session, router_url, BURST_RPS, burst_over, timeline)
        shape["phase"], shape["at_floor"] = "quiet", False
        end = time.monotonic() + QUIET_MAX_S
        drained = lambda: shape["at_floor"] and not local.census(MODEL)["leaving"]  # noqa: E731
        await paced(session, router_url, TRICKLE_RPS,
                    lambda: drained() or time.monotonic() > end, timeline)  # fmt: skip
        await asyncio.gather(*list(timeline.pending))
        shape["phase"] = "done"
        await watcher
        await sample(admin, admin_url, local, timeline)
    timeline.hosts_started, timeline.hosts_removed = local.started, local.stopped
    return timeline


async def scaled(router_url: str, admin_url: str, token: str, consul: str, workdir: Path,
                 burst_s: float) -> Timeline:  # fmt: skip
    """The local executor and `gpuroute scale`'s loop around the traffic."""
    settings = LocalFleetSettings(consul=consul, workdir=workdir / "hosts", max_hosts=5,
                                  boot_delay_s=BOOT_DELAY_S)  # fmt: skip
    local, stop, loop = LocalFleet(settings), asyncio.Event(), None
    try:
        await local.start()
        loop = asyncio.create_task(Scaler([RouterAdmin(admin_url, token)], local).run(stop))
        return await drive(router_url, admin_url, token, local, burst_s)
    finally:
        stop.set()
        if loop is not None:
            await loop
        await local.close()


def table(timeline: Timeline) -> Table:
    t = Table(title="the pool as the router and the executor saw it", title_justify="left")
    for column in ("time", "rate (req/s)", "desired (+ standby)", "in rotation", "standby",
                   "hosts running", "booting", "draining"):  # fmt: skip
        t.add_column(column, justify="right")
    for row in timeline.rows:
        t.add_row(*row)
    return t


def run_autoscale_demo(burst_s: float = 12.0) -> int:
    console = Console(width=None if sys.stdout.isatty() else 150)
    binary = consul_binary()
    if binary is None:
        console.print(f"[red]demo --autoscale: hosts register in Consul. {HOW_TO_GET_CONSUL}[/]")
        return 2
    scale_log = logging.getLogger("gpuroute.scale")
    if not scale_log.isEnabledFor(logging.DEBUG):  # the timeline says what it did
        scale_log.setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="gpuroute-autoscale-demo-"))
    token = secrets.token_urlsafe(24)
    (token_file := workdir / "admin-token").write_text(token + "\n")
    token_file.chmod(0o600)
    router: Child | None = None
    with ConsulDev(binary, log_path=workdir / "consul.log") as consul:
        try:
            port, admin_port = free_ports(2)
            config = consul_router_toml(port, admin_port, consul.address, str(token_file))
            (workdir / "router.toml").write_text(config + AUTOSCALE)
            cmd = [sys.executable, "-m", "gpuroute.cli", "router", "--config", "router.toml"]
            router = spawn("router", cmd, workdir, port)
            wait_http(f"http://127.0.0.1:{port}/healthz", 60, router, "router")
            console.print(f"Consul dev agent on {consul.address}; router on :{port}, sizing "
                          f"{MODEL} at 2 req/s per backend (1..3 + 1 standby)")  # fmt: skip
            router_url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
            timeline = asyncio.run(
                scaled(router_url, admin_url, token, consul.address, workdir, burst_s)
            )
        except StartError as exc:
            console.print(f"[red]demo: {exc}[/]")
            return 1
        finally:
            if router is not None:
                with contextlib.suppress(Exception):
                    router.stop()
    console.print(table(timeline))
    console.print(f"hosts started {timeline.hosts_started}, drained and stopped "
                  f"{timeline.hosts_removed} "
                  f"(boot delay {BOOT_DELAY_S:g} s; logs in {workdir})")  # fmt: skip
    console.print(f"[bold]{timeline.sent} requests sent, {timeline.failed} failed[/]")
    return 0 if timeline.failed == 0 else 1
