"""The global tier in process, in front of one made-up region (tests of its data plane)."""

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
async def global_tier(tmp_path, region_url: str):
    """The global tier in front of one 'region' whose router is `region_url`; the region is
    made up by feeding it a report directly (no gRPC stream in this test)."""
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    (tmp_path / "global.toml").write_text(
        GLOBAL_ON_LOOPBACK + 'regions_file = "regions.toml"\ntick_s = 0.05\n[listen]\nport = 0\n'
        "[region_health]\nup_after_s = 0.0\n"
        f'[[endpoints]]\nregion = "eu-west"\nurl = "{region_url}"\n'
        f'report = "127.0.0.1:{free_port()}"\n'
    )
    app = GlobalApp(*load_global_config(tmp_path / "global.toml"))
    server = GlobalServer(app)
    await server.start()
    report = load_pb2.RegionReport(routable_backends=1, models=[MODEL], timestamp=time.time())
    app.feeds.on_report("eu-west", report)
    app.feeds.tick()
    assert [v.name for v in app.feeds.views if v.up] == ["eu-west"]
    try:
        yield f"http://127.0.0.1:{server.port}", app
    finally:
        await server.drain(timeout=2.0)
