"""The admin write API (issue 34 item 5): reload, backends and keys change what the router
serves and to whom, and `/admin/config` shows its config. Attacks, each a regression:
a caller without the admin token (or with a wrong one) reloads, adds a backend that
points at their own server, adds a key for themselves, revokes a tenant's key, or reads
the config with its secrets; the config's secrets leak through `/admin/config`; a revoked
key comes back with the next reload while the file still lists it; revoking the last key
opens the router to keyless callers. And (issue 42 item 2) a web page in a browser on the
router's host used the tokenless admin listener (the shipped default): a cross-site
`text/plain` POST added a key and a backend, and a page rebound to 127.0.0.1 read the
config."""

from __future__ import annotations

import asyncio
import json
import subprocess

import aiohttp
import pytest
from support.live import environ_without_proxies, gpuroute_cmd, router_server, scripted_backend
from support_admin import page_attacks, unrefused
from support_security import KEY, MODEL, RecordingEngine, keys_section, secure_toml

from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
TOKEN = "admin-secret-1"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
GOOD_JSON = {**GOOD, "Content-Type": "application/json"}  # every admin write is JSON
WRITES = [
    ("POST", "/admin/reload", None),
    ("GET", "/admin/config", None),
    ("POST", "/admin/backends", {"url": "http://203.0.113.9:80", "gpu": "H100", "models": ["m"]}),
    ("POST", "/admin/backends/x/drain", None),
    ("DELETE", "/admin/backends/x", None),
    ("GET", "/admin/keys", None),
    ("POST", "/admin/keys", {"key": "attacker", "tenant": "mallory"}),
    ("DELETE", f"/admin/keys/{key_digest(KEY)}", None),
]
SECRETS = ("admin-secret-1", "engine-secret-2", "redis-pass-3", "decision-key-4")


async def test_every_admin_write_needs_the_admin_token(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, top=f'admin_token = "{TOKEN}"', auth=keys_section())
        async with router_server(text, tmp_path) as server:
            admin = f"http://127.0.0.1:{server.admin_port}"
            public = f"http://127.0.0.1:{server.port}"
            app = server.servable
            before = sorted(b.backend_id for b in app.scheduler.backends)
            async with aiohttp.ClientSession() as s:
                for headers in ({}, {"Authorization": "Bearer guessed"}):
                    for method, path, body in WRITES:
                        for base in (admin, public):  # nor are they on the public port
                            async with s.request(
                                method, base + path, json=body, headers=headers
                            ) as r:
                                assert r.status in ((401,) if base == admin else (404, 405)), (
                                    base,
                                    path,
                                )
                async with s.get(admin + "/admin/keys", headers=GOOD) as r:
                    assert r.status == 200
    assert sorted(b.backend_id for b in app.scheduler.backends) == before
    assert key_digest("attacker") not in app.proxy.front.tenants.quotas.keys
    assert key_digest(KEY) in app.proxy.front.tenants.quotas.keys


async def test_the_effective_config_hides_every_secret(tmp_path) -> None:
    top = f'admin_token = "{TOKEN}"\nengine_api_key = "engine-secret-2"'
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, top=top)
        async with router_server(text, tmp_path) as server:
            admin = f"http://127.0.0.1:{server.admin_port}"
            server.servable.running.config = server.servable.config.model_copy(
                update={
                    "redis": server.servable.config.redis.model_copy(
                        update={"url": "redis://user:redis-pass-3@10.0.0.1:6379/0"}
                    ),
                    "region": server.servable.config.region.model_copy(
                        update={"decision_key": "decision-key-4"}
                    ),
                }
            )  # as a file would set them (without a Redis to reach here)
            async with (
                aiohttp.ClientSession() as s,
                s.get(admin + "/admin/config", headers=GOOD) as r,
            ):
                text = await r.text()
    assert r.status == 200
    for secret in SECRETS:
        assert secret not in text
    assert "10.0.0.1:6379" in text  # the rest of the URL stays readable


async def test_a_revoked_key_stays_revoked_through_a_reload(tmp_path) -> None:
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, top=f'admin_token = "{TOKEN}"', auth=keys_section())
        async with router_server(text, tmp_path) as server:
            server.servable.operator.reloader.path = tmp_path / "router.toml"
            admin = f"http://127.0.0.1:{server.admin_port}"
            public = f"http://127.0.0.1:{server.port}"
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            user = {"Authorization": f"Bearer {KEY}"}
            async with aiohttp.ClientSession() as s:
                async with s.delete(
                    admin + f"/admin/keys/{key_digest(KEY)}", headers=GOOD_JSON
                ) as r:
                    assert r.status == 200
                async with s.post(admin + "/admin/reload", headers=GOOD_JSON) as r:
                    assert r.status == 200, await r.text()
                for headers in (user, {}):  # the key, and no key now that none is left
                    async with s.post(
                        public + "/v1/chat/completions", json=body, headers=headers
                    ) as r:
                        assert r.status == 401


PAGE_KEY = "sk-from-a-web-page"
PAGE_WRITES = [
    ("POST", "/admin/keys", json.dumps({"key": PAGE_KEY, "tenant": "mallory"}).encode()),
    ("POST", "/admin/backends", json.dumps(
        {"url": "http://203.0.113.9:80", "gpu": "H100", "models": [MODEL]}).encode()),
    ("POST", "/admin/reload", b""),
    ("DELETE", f"/admin/keys/{key_digest(KEY)}", b""),
]  # fmt: skip
PAGE_READS = ["/admin/config", "/admin/keys", "/admin/backends", "/metrics"]


async def chat_status(public: str, key: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            public + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r,
    ):
        return r.status


async def test_a_web_page_cannot_use_a_tokenless_admin_listener(tmp_path) -> None:
    """The shipped default (admin on loopback, no token): every write a page can send is
    refused, and so is every read through a rebound name; the CLI still works."""
    async with scripted_backend(RecordingEngine()) as url:
        async with router_server(secure_toml(url, auth=keys_section()), tmp_path) as server:
            admin = f"http://127.0.0.1:{server.admin_port}"
            public = f"http://127.0.0.1:{server.port}"
            app = server.servable
            before = sorted(b.backend_id for b in app.scheduler.backends)
            attacks = page_attacks(server.admin_port, PAGE_WRITES, PAGE_READS)
            assert await unrefused(admin, attacks) == []
            assert await chat_status(public, PAGE_KEY) == 401
            assert sorted(b.backend_id for b in app.scheduler.backends) == before
            (tmp_path / "new.key").write_text("sk-from-the-cli\n")
            added = await asyncio.to_thread(
                subprocess.run,
                gpuroute_cmd("admin", "keys", "add", "--key-file", str(tmp_path / "new.key"),
                             "--tenant", "ops", "--admin-url", admin),
                capture_output=True, text=True, timeout=60, env=environ_without_proxies(),
            )  # fmt: skip
            assert added.returncode == 0, added.stderr  # what the operator runs still works
            assert await chat_status(public, "sk-from-the-cli") == 200
            assert await chat_status(public, KEY) == 200
