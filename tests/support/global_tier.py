"""The global tier in process, in front of made-up regions (tests of its data plane)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpuroute.global_.config import load_global_config
from gpuroute.global_.region_attempts import REGION_HEADER
from gpuroute.global_.server import GlobalApp, GlobalServer
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK, ROUTER_ON_LOOPBACK

from gpuroute.auth import key_digest
from gpuroute.proto import load_pb2
from support.live import (
    MODEL,
    free_port,
    free_ports,
    gpuroute_cmd,
    http_ok,
    spans_to,
    wait_for,
)
from support.paths import REPO

# an EU-only tenant and the key between the tiers, as the continuation tests configure them
DECISION_KEY = "between-the-tiers"
EU_KEY = "sk-acme-eu"
RESIDENCY = (
    '[residency]\ntenants = { acme-eu = ["eu"] }\nallow_anonymous = true\n'
    f'api_keys = {{ "{key_digest(EU_KEY)}" = "acme-eu" }}\ndecision_key = "{DECISION_KEY}"\n'
)
FIRST = {REGION_HEADER: "eu-west"}  # where every stream starts


@dataclass
class RegionRouter:
    """A region's router as a child process, so an outage can be a SIGKILL."""

    url: str
    report_port: int  # its RegionLoad stream
    proc: subprocess.Popen

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@contextlib.contextmanager
def router_process(tmp_path: Path, region: str, rest: str, region_lines: str = ""):
    """`gpuroute router` for `region` on free loopback ports, streaming region reports:
    `rest` is its TOML after the [region] section (backends, models), `region_lines` more
    lines of that section. Its log is router-{region}.log in `tmp_path`. A port taken
    between choosing it and binding it (other tests run beside this one) is chosen again,
    twice at most."""
    for _ in range(3):
        router = _start_router(tmp_path, region, rest, region_lines)
        if router is not None:
            break
    else:
        raise AssertionError((tmp_path / f"router-{region}.log").read_text()[-2000:])
    try:
        yield router
    finally:
        router.kill()


def _start_router(tmp_path: Path, region: str, rest: str, region_lines: str) -> RegionRouter | None:
    """The router up (None: it exited, its log says why)."""
    port, report = free_ports(2)
    path = tmp_path / f"router-{region}.toml"
    path.write_text(
        ROUTER_ON_LOOPBACK + f"tick_s = 0.05\n[listen]\nport = {port}\n"
        f'[region]\nname = "{region}"\nreport_period_s = 0.1\n{region_lines}'
        f"[region.report_listen]\nport = {report}\n{rest}"
    )
    with (tmp_path / f"router-{region}.log").open("wb") as log:
        proc = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(path)), stdout=subprocess.DEVNULL, stderr=log
        )
    router = RegionRouter(f"http://127.0.0.1:{port}", report, proc)
    try:
        wait_for(lambda: proc.poll() is not None or http_ok(router.url + "/healthz"), 20, region)
    except BaseException:
        router.kill()
        raise
    return router if proc.poll() is None else None


@contextlib.asynccontextmanager
async def global_tier(tmp_path, region_url: str, extra: str = ""):
    """The global tier in front of one 'region' (eu-west) whose router is `region_url`."""
    async with global_over(tmp_path, {"eu-west": region_url}, extra) as tier:
        yield tier


@contextlib.asynccontextmanager
async def global_over(tmp_path, routers: dict[str, str], extra: str = "", spans=None):
    """The global tier in front of regions (of regions.example.toml) whose routers are at
    the URLs given; each region is made up by feeding it a report directly (no gRPC
    stream), and stays up for the test. `extra`: more TOML, top-level keys first; `spans`:
    an in-memory exporter its spans go to (with `[tracing]` in `extra`), flushed at the end."""
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    endpoints = "".join(
        f'[[endpoints]]\nregion = "{region}"\nurl = "{url}"\nreport = "127.0.0.1:{free_port()}"\n'
        for region, url in routers.items()
    )
    (tmp_path / "global.toml").write_text(
        GLOBAL_ON_LOOPBACK
        + 'regions_file = "regions.toml"\ntick_s = 0.05\n'
        + extra
        + "\n[listen]\nport = 0\n[region_health]\nup_after_s = 0.0\nstale_after_s = 3600\n"
        + endpoints
    )
    app = GlobalApp(*load_global_config(tmp_path / "global.toml"))
    server = GlobalServer(app)
    await server.start()
    report = load_pb2.RegionReport(routable_backends=1, models=[MODEL], timestamp=time.time())
    for region in routers:
        app.feeds.on_report(region, report)
    app.feeds.tick()
    assert sorted(v.name for v in app.feeds.views if v.up) == sorted(routers)
    try:
        with spans_to(server, spans) if spans is not None else contextlib.nullcontext():
            yield f"http://127.0.0.1:{server.port}", app
    finally:
        await server.drain(timeout=2.0)
