"""The tiers with security on (issue 16, "what it must show"): a global tier in front of two
regional routers over mutual TLS, region reports over mutual TLS, API keys required, signed
residency decisions, and routers that serve only the global tier."""

from __future__ import annotations

import random
import ssl

import aiohttp
import pytest
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import REGION_HEADER, GlobalApp, GlobalServer
from gpuroute.router.config.router import load_router_config
from gpuroute.router.http.server import RouterApp
from gpuroute.router.process import RouterServer
from gpuroute.testbed.certs import LocalCA
from gpuroute.testbed.ports import free_port
from support.live import FakeEngineProcess, async_wait_for
from support.paths import REPO
from support_security import chat

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
KEY, EU_KEY, DECISION_KEY = "sk-acme", "sk-acme-eu", "tiers-share-this"
REGIONS = {"us-east": "us", "eu-west": "eu"}


def router_toml(ca: LocalCA, region: str, engine: str, report_port: int) -> str:
    tls = ca.server_section(f"router-{region}")
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{key_digest(k)}"\ntenant = "{t}"\n'
        for k, t in ((KEY, "acme"), (EU_KEY, "acme-eu"))
    )
    return (
        f"tick_s = 0.05\n[listen]\nport = 0\n[listen.tls]\n{tls}[admin_listen]\nport = 0\n"
        f'[region]\nname = "{region}"\njurisdiction = "{REGIONS[region]}"\n'
        f'decision_key = "{DECISION_KEY}"\nrequire_global_decision = true\n'
        f"report_period_s = 0.1\n[region.report_listen]\nport = {report_port}\n"
        f"[region.report_listen.tls]\n{tls}{keys}"
        f'[[backends]]\nurl = "{engine}"\ngpu = "H100"\nmodels = ["llama-3.1-8b"]\n'
    )


def global_toml(ca: LocalCA, endpoints: dict[str, tuple[int, int]]) -> str:
    client = ca.client_section("global-tier")
    lines = [
        'regions_file = "regions.toml"\ntick_s = 0.05\n[listen]\nport = 0',
        "[admin_listen]\nport = 0\n[region_health]\nstale_after_s = 1.0\nup_after_s = 0.5",
        f"[router_tls]\n{client}[report_tls]\n{client}",
        f'[residency]\ndecision_key = "{DECISION_KEY}"\ntenants = {{ acme-eu = ["eu"] }}',
        f'api_keys = {{ "{key_digest(KEY)}" = "acme", "{key_digest(EU_KEY)}" = "acme-eu" }}',
    ]
    for region, (port, report) in endpoints.items():
        lines.append(
            f'[[endpoints]]\nregion = "{region}"\nurl = "https://127.0.0.1:{port}"\n'
            f'report = "127.0.0.1:{report}"'
        )
    return "\n".join(lines) + "\n"


async def test_global_to_routers_over_mutual_tls_with_keys_and_signed_residency(tmp_path) -> None:
    ca = LocalCA(tmp_path)
    engines = [FakeEngineProcess("H100", time_scale=0.01) for _ in REGIONS]
    routers: dict[str, RouterServer] = {}
    try:
        endpoints = {}
        for (region, _), engine in zip(REGIONS.items(), engines, strict=True):
            path = tmp_path / f"{region}.toml"
            path.write_text(router_toml(ca, region, engine.url, free_port()))
            server = RouterServer(RouterApp(load_router_config(path), rng=random.Random(0)))
            await server.start()
            routers[region] = server
            endpoints[region] = (server.port, server.servable.region_port)
        (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
        (tmp_path / "global.toml").write_text(global_toml(ca, endpoints))
        app = GlobalApp(*load_global_config(tmp_path / "global.toml"))
        front = GlobalServer(app)
        await front.start()
        try:
            await _check(app, front, routers, ca)
        finally:
            await front.drain(timeout=2.0)
    finally:
        for server in routers.values():
            await server.drain(timeout=2.0)
        for engine in engines:
            engine.stop()


async def _check(app, front, routers, ca) -> None:
    url = f"http://127.0.0.1:{front.port}/v1/chat/completions"

    async def all_up() -> bool:  # the region reports arrive over mutual TLS
        return all(v.up for v in app.feeds.views)

    await async_wait_for(all_up, 20, "both regions up through mutual-TLS reports")
    async with aiohttp.ClientSession() as s:
        async with s.post(url, data=chat(), headers={"Content-Type": "application/json"}) as r:
            assert r.status == 401  # keys required at the global tier
        for spelling in ("Bearer", "bearer"):
            headers = {"Authorization": f"{spelling} {EU_KEY}", "x-gpuroute-region": "us-east"}
            async with s.post(url, data=chat(), headers=headers) as r:
                assert r.status == 200 and r.headers[REGION_HEADER] == "eu-west", spelling
        async with s.post(url, data=chat(), headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 200
        # straight to a regional router: no client certificate, no TLS at all
        direct = f"https://127.0.0.1:{routers['eu-west'].port}/v1/chat/completions"
        trusting = ssl.create_default_context(cafile=str(ca.ca_file))
        with pytest.raises(aiohttp.ClientError):
            async with s.post(direct, data=chat(), ssl=trusting) as r:
                await r.read()
        # with a stolen client certificate but no decision from the global tier: refused
        cert, key = ca.issue("stolen", client=True)
        trusting.load_cert_chain(cert, key)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        async with s.post(direct, data=chat(), headers=headers, ssl=trusting) as r:
            assert r.status == 403
            assert (await r.json())["error"]["code"] == "global_decision_required"
