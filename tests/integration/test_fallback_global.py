"""Fallback across regions: two regions on loopback (a router each, streaming its region
report) behind the global tier. eu-west serves `heavy` (alias `chat`) falling back to
`light`; us-east serves `heavy` alone. Once eu-west's heavy engine is down, a request with
an EU-only key is served by the light model in the EU or refused, never served in the US;
one without residency that forbids fallback spills to us-east. The global tier passes
`x-gpuroute-fallback` on and knows the aliases regions advertise."""

from __future__ import annotations

import contextlib
from pathlib import Path

import aiohttp
import pytest
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import REGION_HEADER, GlobalApp, GlobalServer
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK
from support.global_tier import RegionRouter, router_process
from support.live import FakeEngineProcess, async_wait_for
from support.paths import REPO

from gpuroute.auth import key_digest
from gpuroute.headers import FALLBACK_HEADER, SERVED_MODEL_HEADER

pytestmark = pytest.mark.asyncio
EU_KEY = "sk-acme-eu"
HEAVY = '[[models]]\nname = "heavy"\naliases = ["chat"]\n'


def global_toml(regions: dict[str, tuple[str, int]]) -> str:
    lines = [
        GLOBAL_ON_LOOPBACK + 'regions_file = "regions.toml"\ntick_s = 0.05',
        "[listen]\nport = 0",
        "[region_health]\nstale_after_s = 1.0\nup_after_s = 0.2",
        f'[residency]\ntenants = {{ acme-eu = ["eu"] }}\n'
        f'api_keys = {{ "{key_digest(EU_KEY)}" = "acme-eu" }}\nallow_anonymous = true',
        *(f'[[endpoints]]\nregion = "{r}"\nurl = "{url}"\nreport = "127.0.0.1:{report}"'
          for r, (url, report) in regions.items()),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def region_router(tmp_path: Path, region: str, backends: dict[str, str], models: str):
    """A region's router (a refused connection takes an engine out at once, as in the
    other live tests) over its engines (served name: URL)."""
    rest = "".join(f'[[backends]]\nurl = "{url}"\ngpu = "H100"\nmodels = ["{name}"]\n'
                   for name, url in backends.items())  # fmt: skip
    return router_process(tmp_path, region, rest + models)


@contextlib.asynccontextmanager
async def two_regions(tmp_path: Path):
    """eu-west (heavy falling back to light) and us-east (heavy), the global tier in
    front; yields its URL, the engines by name and a client session."""
    specs = {"eu-heavy": ("llama-3.1-8b", "heavy"), "eu-light": ("llama-3.2-3b", "light"),
             "us-heavy": ("llama-3.1-8b", "heavy")}  # fmt: skip
    engines: dict[str, FakeEngineProcess] = {}
    try:
        for key, (shape, served) in specs.items():
            extra = ("--model", shape, "--served-name", served)
            engines[key] = FakeEngineProcess("H100", extra=extra)
        eu = {"heavy": engines["eu-heavy"].url, "light": engines["eu-light"].url}
        eu_models = HEAVY + 'fallback = ["light"]\n[[models]]\nname = "light"\n'
        us = {"heavy": engines["us-heavy"].url}
        with (
            region_router(tmp_path, "eu-west", eu, eu_models) as eu_west,
            region_router(tmp_path, "us-east", us, HEAVY) as us_east,
        ):
            yield await _global_tier(tmp_path, {"eu-west": eu_west, "us-east": us_east}), engines
    finally:
        for engine in engines.values():
            engine.stop()


async def _global_tier(tmp_path: Path, regions: dict[str, RegionRouter]):
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    routers = {name: (r.url, r.report_port) for name, r in regions.items()}
    (tmp_path / "global.toml").write_text(global_toml(routers))
    server = GlobalServer(GlobalApp(*load_global_config(tmp_path / "global.toml")))
    await server.start()
    return server


async def ask(s: aiohttp.ClientSession, url: str, **headers: str) -> tuple[int, str | None, str]:
    """(status, region, served model or the error's code) for one `chat` request."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        answer = await r.json()
        if r.status != 200:
            return r.status, r.headers.get(REGION_HEADER), answer["error"]["code"]
        assert r.headers[SERVED_MODEL_HEADER] == answer["model"]
        return r.status, r.headers.get(REGION_HEADER), answer["model"]


async def regions_serving(s: aiohttp.ClientSession, url: str) -> dict[str, set[str]]:
    async with s.get(url + "/admin/regions") as r:
        regions = (await r.json())["regions"]
    return {x["region"]: set(x["models"]) for x in regions if x["state"] == "up"}


async def test_an_eu_key_falls_back_in_the_eu_or_is_refused_never_served_in_the_us(
    tmp_path,
) -> None:
    eu_key = {"Authorization": f"Bearer {EU_KEY}"}
    none, hint_eu = {FALLBACK_HEADER: "none"}, {REGION_HEADER: "eu-west"}
    async with two_regions(tmp_path) as (server, engines), aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{server.port}"
        try:

            async def both_up() -> bool:
                return (await regions_serving(s, url)).keys() == {"eu-west", "us-east"}

            await async_wait_for(both_up, 20, "both regions up")
            # regions advertise the alias beside the served names; /v1/models lists it
            assert await regions_serving(s, url) == {
                "eu-west": {"chat", "heavy", "light"}, "us-east": {"chat", "heavy"},
            }  # fmt: skip
            async with s.get(url + "/v1/models") as r:
                assert {m["id"] for m in (await r.json())["data"]} == {"chat", "heavy", "light"}
            # both engines up: the EU key is served by the heavy model, in the EU
            assert await ask(s, url, **eu_key) == (200, "eu-west", "heavy")
            assert await ask(s, url, **eu_key, **none) == (200, "eu-west", "heavy")
            engines["eu-heavy"].kill()  # eu-west's heavy pool is down
            eu_only = [await ask(s, url, **eu_key) for _ in range(4)]
            eu_only_none = [await ask(s, url, **eu_key, **none) for _ in range(3)]
            # without residency: the light model in the EU, or heavy in the US when
            # fallback is forbidden (eu-west refuses, the global tier moves on)
            anyone = await ask(s, url, **hint_eu)
            spilled = [await ask(s, url, **hint_eu, **none) for _ in range(3)]
            # refusals for one model are not the region failing: eu-west stays up, and
            # still answers `heavy` (by its fallback)
            after = await regions_serving(s, url)
        finally:
            await server.drain(timeout=2.0)
    assert eu_only == [(200, "eu-west", "light")] * 4
    assert eu_only_none == [(502, None, "upstream_error")] * 3  # EU said 503: nowhere else
    assert anyone == (200, "eu-west", "light")
    assert spilled == [(200, "us-east", "heavy")] * 3
    assert after == {"eu-west": {"chat", "heavy", "light"}, "us-east": {"chat", "heavy"}}
