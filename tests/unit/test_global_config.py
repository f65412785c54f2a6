"""Global tier configuration: every problem names the file and the key."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time

import pytest
from gpuroute.global_.config import GlobalConfig, load_global_config
from support.paths import REPO

from gpuroute.config import ConfigError

BASE = 'regions_file = "regions.toml"\n'
ENDPOINT = '[[endpoints]]\nregion = "eu-west"\nurl = "http://127.0.0.1:9"\nreport = "127.0.0.1:9"\n'


def write(tmp_path, text: str):
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    path = tmp_path / "global.toml"
    path.write_text(text)
    return path


def test_example_global_config_loads() -> None:
    config, _fleet, rules = load_global_config(REPO / "global.example.toml")
    assert config.policy == "ours" and len(config.endpoints) == 3
    assert rules.jurisdictions == {"us", "eu", "jp"} and rules.tenants["acme-eu"] == {"eu"}
    assert config.continuation == GlobalConfig().continuation  # the default, shown
    assert GlobalConfig().continuation.enabled  # on unless turned off


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BASE, "endpoints: list [[endpoints]] or set discovery.consul"),
        (BASE + 'geoip_database = "nope.mmdb"\n' + ENDPOINT, "geoip_database: "),
        (BASE + ENDPOINT.replace("eu-west", "mars"), "endpoints[0].region: unknown region 'mars'"),
        (BASE + '[residency]\ntenants = { t = ["moon"] }\n' + ENDPOINT,
         "residency.tenants.t: unknown jurisdiction 'moon'"),
        (BASE + '[residency]\ncountries = { germany = ["eu"] }\n' + ENDPOINT,
         "residency.countries.germany: use ISO 3166"),
        (BASE + '[residency]\napi_keys = { "abc" = "t" }\n' + ENDPOINT,
         "residency.api_keys: abc...: expected a lowercase sha256"),
        (BASE + 'trusted_proxies = ["10.0.0.0/33"]\n' + ENDPOINT, "trusted_proxies[0]: "),
        (BASE + 'policy = "fastest"\n' + ENDPOINT, "policy: unknown global policy"),
        (BASE + "[continuation]\nmax_attempts = 0\n" + ENDPOINT, "continuation.max_attempts"),
        (BASE + "[continuation]\nenable = true\n" + ENDPOINT, "continuation.enable"),
    ],
)  # fmt: skip
def test_bad_global_config_names_file_and_key(tmp_path, text, message) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_global_config(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_global_cli_exits_2_with_the_reason(tmp_path, capsys) -> None:
    from gpuroute.cli import main

    path = write(tmp_path, BASE)
    assert main(["global", "--config", str(path)]) == 2
    assert "list [[endpoints]] or set discovery.consul" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_api_key_maps_to_a_tenant_and_decisions_are_logged(tmp_path, caplog) -> None:
    import aiohttp
    from gpuroute.global_.server import GlobalApp, GlobalServer

    digest = hashlib.sha256(b"sk-eu-123").hexdigest()
    residency = f'tenants = {{ acme-eu = ["eu"] }}\napi_keys = {{ "{digest}" = "acme-eu" }}\n'
    text = BASE + "decision_log_sample = 1.0\n[listen]\nport = 0\n[residency]\n" + residency
    text += ENDPOINT
    config, fleet, rules = load_global_config(write(tmp_path, text))
    app = GlobalApp(config, fleet, rules, rng=random.Random(0))
    server = GlobalServer(app)
    await server.start()
    caplog.set_level(logging.INFO, "gpuroute.global.decisions")
    try:
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            body = {"model": "m", "messages": []}
            headers = {"Authorization": "Bearer sk-eu-123"}
            async with s.post(url, json=body, headers=headers) as r:
                answer = await r.json()
            assert r.status == 503 and "tenant acme-eu" in answer["error"]["message"]
            assert r.headers["Retry-After"] == "1"  # eu-west is not up (never reported)
            async with s.post(url, data=b"{not json") as r:
                assert r.status == 401  # who is asking comes before the body
            async with s.post(url, data=b"{not json", headers=headers) as r:
                assert r.status == 400
            async with s.post(url, json={"messages": []}, headers=headers) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "model"
    finally:
        await server.drain(timeout=1.0)
    entries = [r.decision for r in caplog.records if r.name == "gpuroute.global.decisions"]
    assert any(
        e["rules"] == ["tenant acme-eu"] and e["reason"] == "region_unavailable" for e in entries
    ), entries


@pytest.mark.asyncio
async def test_a_report_stream_that_will_not_close_does_not_hang_shutdown(tmp_path, caplog) -> None:
    """A cancelled gRPC call's channel can fail to close; the feeds wait a bounded time, say
    so, and shutdown goes on (a system test hung in drain without the bound)."""
    from gpuroute.global_.server import GlobalApp

    config, fleet, rules = load_global_config(write(tmp_path, BASE + ENDPOINT))
    feeds = GlobalApp(config, fleet, rules, rng=random.Random(0)).feeds
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    feeds._tasks["eu-west"] = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    started = time.monotonic()
    await feeds.close(timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    assert "1 region report streams did not close in 0 s" in caplog.text
    release.set()
