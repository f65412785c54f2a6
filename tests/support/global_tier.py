"""The global tier in process, in front of made-up regions (tests of its data plane)."""

from __future__ import annotations

import contextlib
import time

from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import GlobalApp, GlobalServer
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK

from gpuroute.proto import load_pb2
from support.live import MODEL, free_port
from support.paths import REPO


@contextlib.asynccontextmanager
async def global_tier(tmp_path, region_url: str, extra: str = ""):
    """The global tier in front of one 'region' (eu-west) whose router is `region_url`."""
    async with global_over(tmp_path, {"eu-west": region_url}, extra) as tier:
        yield tier


@contextlib.asynccontextmanager
async def global_over(tmp_path, routers: dict[str, str], extra: str = ""):
    """The global tier in front of regions (of regions.example.toml) whose routers are at
    the URLs given; each region is made up by feeding it a report directly (no gRPC
    stream), and stays up for the test. `extra`: more TOML, top-level keys first."""
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
        yield f"http://127.0.0.1:{server.port}", app
    finally:
        await server.drain(timeout=2.0)
