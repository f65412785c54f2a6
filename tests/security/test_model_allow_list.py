"""Issue 42 finding 7: every key reached every model, and a fallback silently moved a key's
requests onto an expensive model. `[[auth.keys]] models` (LiteLLM's name for a virtual
key's list) now holds for names, aliases, split versions and fallbacks alike, filters
`/v1/models`, and is kept by keys the admin API adds."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gpuroute.router.core.model_routes import split_bucket
from gpuroute.router.front.parse import session_key
from support.live import router_server, scripted_backend
from support_security import KEY, MODEL, RecordingEngine

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
OTHER = "sk-tenant-unlimited"
AUTH = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
MODELS = """
[[models]]
name = "cheap"
aliases = ["cheap-latest"]
fallback = ["big"]
[[models]]
name = "big"
aliases = ["sneaky"]
[[models]]
name = "m"
split = { "m@v1" = 50, "m@v2" = 50 }
"""


def fleet(cheap: str, big: str, key_models: str = '["cheap-latest", "m@v1"]') -> str:
    """`cheap` and the split on one engine, `big` on another; KEY may use the models named
    (here: cheap through its alias, and one version of m), OTHER any."""
    return f"""
[listen]
port = 0
[admin_listen]
port = 0
[auth]
[[auth.keys]]
sha256 = "{key_digest(KEY)}"
tenant = "acme"
models = {key_models}
[[auth.keys]]
sha256 = "{key_digest(OTHER)}"
tenant = "other"
{MODELS}
[[backends]]
id = "cheap"
url = "{cheap}"
gpu = "L4"
models = ["cheap", "m@v1", "m@v2"]
[[backends]]
id = "big"
url = "{big}"
gpu = "H100"
models = ["big"]
"""


def session_for(version: str) -> str:
    """A session id whose requests for `m` land on `version` (50/50 split)."""
    for i in range(1000):
        bucket = split_bucket("m", session_key(f"s{i}"))
        if (bucket < 0.5) == (version == "m@v1"):
            return f"s{i}"
    raise AssertionError("no session found")


def chat(model: str) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})


@contextlib.asynccontextmanager
async def cheap_and_big(
    tmp_path: Path,
) -> AsyncIterator[tuple[Any, RecordingEngine, RecordingEngine]]:
    """A router over two recording engines, `cheap` and `big` (the fleet above)."""
    cheap, big = RecordingEngine(), RecordingEngine()
    async with scripted_backend(cheap) as cheap_url, scripted_backend(big) as big_url:
        async with router_server(fleet(cheap_url, big_url), tmp_path) as server:
            yield server, cheap, big


async def test_names_aliases_and_split_versions_outside_the_list_are_refused(tmp_path) -> None:
    async with cheap_and_big(tmp_path) as (server, _, big):
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as s:
            statuses = {}
            for model, session in (
                ("big", "a"), ("sneaky", "a"), ("cheap", "a"), ("cheap-latest", "a"),
                ("m", session_for("m@v1")), ("m", session_for("m@v2")), ("m@v2", "a"),
            ):  # fmt: skip
                headers = {**AUTH, "x-session-id": session}
                url = base + "/v1/chat/completions"
                async with s.post(url, data=chat(model), headers=headers) as r:
                    answer = await r.json()
                    statuses[(model, session)] = r.status
                    if r.status == 403:
                        assert answer["error"]["code"] == "model_not_allowed"
                        assert answer["error"]["param"] == "model"
            messages = {"model": "big", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            async with s.post(base + "/v1/messages", json=messages, headers=AUTH) as r:
                answer = await r.json()
                assert r.status == 403 and answer["error"]["type"] == "permission_error"
            async with s.get(base + "/v1/models", headers=AUTH) as r:
                listed = sorted(m["id"] for m in (await r.json())["data"])
            other = {"Authorization": f"Bearer {OTHER}"}
            async with s.get(base + "/v1/models", headers=other) as r:
                everything = sorted(m["id"] for m in (await r.json())["data"])
    assert [statuses[k] for k in statuses] == [403, 403, 200, 200, 200, 403, 403], statuses
    assert big.seen == []
    assert listed == ["cheap", "cheap-latest", "m@v1"]
    assert "big" in everything and "sneaky" in everything


async def test_a_fallback_to_a_model_outside_the_list_is_skipped(tmp_path) -> None:
    """With cheap's only backend drained, cheap falls back to big: for a key that may use
    cheap only, the fallback is skipped (503, nothing reaches big); another key falls back."""
    async with cheap_and_big(tmp_path) as (server, cheap, big):
        base = f"http://127.0.0.1:{server.port}"
        admin = f"http://127.0.0.1:{server.admin_port}"
        async with aiohttp.ClientSession() as s:
            async with s.post(admin + "/admin/backends/cheap/drain", json={}) as r:
                assert r.status == 200, await r.text()
            url = base + "/v1/chat/completions"
            async with s.post(url, data=chat("cheap"), headers=AUTH) as r:
                limited = r.status
            other = {**AUTH, "Authorization": f"Bearer {OTHER}"}
            async with s.post(url, data=chat("cheap"), headers=other) as r:
                unlimited = r.status
    assert (limited, unlimited) == (503, 200)
    assert len(big.seen) == 1 and cheap.seen == []


async def test_keys_added_by_the_admin_api_carry_their_models(tmp_path) -> None:
    added = "sk-added-by-admin"
    async with cheap_and_big(tmp_path) as (server, _, big):
        base = f"http://127.0.0.1:{server.port}"
        admin = f"http://127.0.0.1:{server.admin_port}"
        async with aiohttp.ClientSession() as s:
            body = {"key": added, "tenant": "newco", "models": ["cheap"]}
            async with s.post(admin + "/admin/keys", json=body) as r:
                assert r.status == 201, await r.text()
            async with s.get(admin + "/admin/keys") as r:
                rows = (await r.json())["keys"]
            headers = {**AUTH, "Authorization": f"Bearer {added}"}
            statuses = []
            for model in ("big", "cheap"):
                url = base + "/v1/chat/completions"
                async with s.post(url, data=chat(model), headers=headers) as r:
                    statuses.append(r.status)
    assert statuses == [403, 200]
    assert [row["models"] for row in rows if row.get("tenant") == "newco"] == [["cheap"]]
    assert big.seen == []


async def test_the_global_tier_holds_a_tenants_models_and_lists_only_those(tmp_path) -> None:
    """The global tier knows keys too (`residency.api_keys`): a tenant's
    `residency.tenant_models` is refused there before any region is asked, and its
    `/v1/models` lists only those."""
    import time

    from support_tiers import EU_KEY, two_regions
    from support_tiers import KEY as TIERS_KEY

    from gpuroute.proto import load_pb2

    lists = f'tenant_models = {{ acme = ["{MODEL}"] }}'
    async with two_regions(tmp_path, residency=lists) as tiers, aiohttp.ClientSession() as s:
        report = load_pb2.RegionReport(
            routable_backends=1, models=[MODEL, "big"], timestamp=time.time()
        )
        for region in tiers.routers:
            tiers.app.feeds.on_report(region, report)
        tiers.app.feeds.tick()
        acme = {"Authorization": f"Bearer {TIERS_KEY}"}
        async with s.post(tiers.url + "/v1/chat/completions", data=chat("big"), headers=acme) as r:
            refused = (r.status, (await r.json())["error"])
        messages = {"model": "big", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
        async with s.post(tiers.url + "/v1/messages", json=messages, headers=acme) as r:
            anthropic = (r.status, (await r.json())["error"]["type"])
        async with s.post(tiers.url + "/v1/chat/completions", data=chat(MODEL), headers=acme) as r:
            served = r.status
        listed = {}
        for tenant, key in (("acme", TIERS_KEY), ("acme-eu", EU_KEY)):
            headers = {"Authorization": f"Bearer {key}"}
            async with s.get(tiers.url + "/v1/models", headers=headers) as r:
                listed[tenant] = sorted(m["id"] for m in (await r.json())["data"])
    assert refused[0] == 403 and refused[1]["code"] == "model_not_allowed"
    assert refused[1]["param"] == "model"
    assert anthropic == (403, "permission_error")
    assert served == 200 and sum(tiers.served_in().values()) == 1  # the refused ones: nowhere
    assert listed == {"acme": [MODEL], "acme-eu": sorted([MODEL, "big"])}


async def test_a_key_limited_to_models_may_not_use_passthrough_paths(tmp_path) -> None:
    """A passthrough path goes to a ready backend of any model: a key (or the anonymous
    tenant) limited to some models is refused there (403), before any engine is reached;
    a key without a list passes."""
    cheap, big = RecordingEngine(), RecordingEngine()
    top = 'passthrough_paths = ["/v1/load_lora_adapter"]\n'
    body = json.dumps({"lora_name": "x", "lora_path": "/tmp/x"})
    async with scripted_backend(cheap) as cheap_url, scripted_backend(big) as big_url:
        text = top + fleet(cheap_url, big_url)
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{server.port}/v1/load_lora_adapter"
            async with s.post(url, data=body, headers=AUTH) as r:
                refused = (r.status, (await r.json())["error"])
            assert cheap.seen == big.seen == []
            other = {**AUTH, "Authorization": f"Bearer {OTHER}"}
            async with s.post(url, data=body, headers=other) as r:
                passed = r.status
        anonymous = '[auth.anonymous]\nmodels = ["cheap"]\n'
        text = f"{top}[listen]\nport = 0\n[admin_listen]\nport = 0\n{anonymous}"
        text += f'[[backends]]\nurl = "{cheap_url}"\ngpu = "L4"\nmodels = ["cheap"]\n'
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{server.port}/v1/load_lora_adapter"
            async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                keyless = (r.status, (await r.json())["error"]["code"])
    assert refused[0] == 403 and refused[1]["code"] == "model_not_allowed"
    assert "passthrough paths reach engines of every model" in refused[1]["message"]
    assert "`cheap-latest`, `m@v1`" in refused[1]["message"]
    assert passed == 200
    assert keyless == (403, "model_not_allowed")
    assert len(cheap.seen) + len(big.seen) == 1  # OTHER's only
