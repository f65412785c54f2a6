"""Admin surfaces (issue 30 item 13): the router's and the global tier's admin listeners
had no auth, `check-config` accepted one on 0.0.0.0 without a token, and the Terraform
templates bound 0.0.0.0:9090. Now an admin listener off loopback needs `admin_token`, and
with a token `/metrics` and `/admin/*` ask for it (`/healthz`, `/readyz` stay open).
Issue 42 item 2: the tokenless default answered a web page in the host's browser (a
cross-site POST, a read through a name rebound to 127.0.0.1) at every tier; and with a
token, a request carrying an `Origin` or a `text/plain` body was still taken."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from support.global_tier import global_tier
from support.live import (
    MODEL,
    async_wait_for,
    fake_engines,
    free_port,
    gpuroute_cmd,
    http_ok,
    router_server,
    router_toml,
    scripted_backend,
    wait_for,
)
from support.paths import REPO
from support_admin import EVIL, global_admin_apart, page_attacks, unrefused
from support_security import RecordingEngine, secure_toml

from gpuroute.auth import key_digest

TOKEN = "admin-secret-1"
GOOD = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("kind", ["router", "global"])
def test_an_admin_listener_off_loopback_needs_a_token(tmp_path, kind: str) -> None:
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    if kind == "router":
        body = '[[backends]]\nurl = "http://10.0.0.9:8000"\ngpu = "H100"\nmodels = ["m"]\n'
    else:
        body = (
            'regions_file = "regions.toml"\n[[endpoints]]\nregion = "eu-west"\n'
            'url = "http://10.0.0.9:8080"\nreport = "10.0.0.9:7080"\n'
        )
    for token, code in (("", 2), (f'admin_token_file = "{tmp_path}/t"\n', 0)):
        path = tmp_path / f"{kind}.toml"
        head, _, rest = body.partition("[[")
        path.write_text(token + head + '[admin_listen]\nhost = "0.0.0.0"\nport = 9090\n[[' + rest)
        checked = subprocess.run(
            [sys.executable, "-m", "gpuroute.cli", "check-config", "--kind", kind, str(path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert checked.returncode == code, checked.stderr
        if code:
            assert "admin_listen.host '0.0.0.0' is not loopback: set admin_token" in checked.stderr


async def statuses(base: str, headers: dict | None = None) -> dict[str, int]:
    async with aiohttp.ClientSession() as s:
        found = {}
        paths = ("/healthz", "/readyz", "/metrics", "/admin/backends", "/admin/regions")
        for path in (*paths, "/admin/autoscale"):
            async with s.get(base + path, headers=headers or {}) as r:
                found[path] = r.status
        return found


@pytest.mark.asyncio
@pytest.mark.parametrize("metrics_open", [False, True])
async def test_a_routers_admin_routes_need_the_token(tmp_path, metrics_open: bool) -> None:
    top = f'admin_token = "{TOKEN}"\nadmin_metrics_open = {str(metrics_open).lower()}'
    async with scripted_backend(RecordingEngine()) as url:
        async with router_server(secure_toml(url, top=top), tmp_path) as server:
            admin = f"http://127.0.0.1:{server.admin_port}"
            without, with_token = await statuses(admin), await statuses(admin, GOOD)
            wrong = await statuses(admin, {"Authorization": "Bearer guessed"})
    assert without["/healthz"] == 200 and without["/readyz"] == 200
    assert without["/admin/backends"] == 401 and wrong["/admin/backends"] == 401
    assert without["/admin/autoscale"] == 401 and wrong["/admin/autoscale"] == 401
    assert without["/metrics"] == (200 if metrics_open else 401)
    assert with_token["/admin/backends"] == 200 and with_token["/metrics"] == 200
    assert with_token["/admin/autoscale"] == 200


@pytest.mark.asyncio
async def test_the_global_tiers_admin_routes_need_the_token(tmp_path) -> None:
    async with global_tier(tmp_path, "http://127.0.0.1:9", f'admin_token = "{TOKEN}"') as (
        url,
        _app,
    ):  # its admin routes are on its public loopback listener here
        without, with_token = await statuses(url), await statuses(url, GOOD)
    assert without["/healthz"] == 200 and without["/readyz"] == 200
    assert without["/metrics"] == 401 and without["/admin/regions"] == 401
    assert with_token["/metrics"] == 200 and with_token["/admin/regions"] == 200


def status_of(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=5
        ) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@contextlib.contextmanager
def workers_router(tmp_path: Path, token: str | None = None) -> Iterator[str]:
    """A router of two workers (`--workers 2`) behind the parent's one admin listener, with
    `token` as its admin token or none; yields that listener's URL."""
    with fake_engines(("L4", 1.0)) as (engine,):
        port, admin_port = free_port(), free_port()
        text = router_toml([(engine.url, "L4")], port=port, admin_listen=f"port = {admin_port}")
        text = text.replace("admin_on_public_listener = true\n", "")
        if token is not None:
            text = f'admin_token = "{token}"\n' + text
        (tmp_path / "router.toml").write_text(text)
        router = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(tmp_path / "router.toml"), "--workers", "2"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            yield f"http://127.0.0.1:{admin_port}"
        finally:
            router.terminate()
            router.wait(30)


def test_the_one_admin_listener_of_several_workers_needs_the_token(tmp_path) -> None:
    with workers_router(tmp_path, TOKEN) as admin:
        wait_for(lambda: http_ok(admin + "/readyz"), 60, "both workers ready")
        assert status_of(admin + "/metrics") == 401
        assert status_of(admin + "/admin/backends") == 401
        assert status_of(admin + "/metrics", GOOD) == 200
        assert status_of(admin + "/admin/backends", GOOD) == 200


PAGE_KEY = "sk-from-a-web-page"
KEY_BODY = json.dumps({"key": PAGE_KEY, "tenant": "mallory"}).encode()
BACKEND_BODY = json.dumps({"url": "http://203.0.113.9:80", "gpu": "L4", "models": [MODEL]})


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["own_listener", "public_listener"])
async def test_a_web_page_cannot_read_the_global_tiers_admin_routes(tmp_path, where) -> None:
    """`/admin/regions` and `/metrics` through a rebound name, or asked cross-site."""
    reads = ["/admin/regions", "/metrics"]
    writes = [("POST", "/admin/regions", b"{}")]  # none exists; refused before the 405
    if where == "own_listener":
        async with global_admin_apart(tmp_path) as (admin, port):
            wrong = await unrefused(admin, page_attacks(port, writes, reads))
            assert (await statuses(admin))["/admin/regions"] == 200  # as curl asks, on loopback
    else:
        async with global_tier(tmp_path, "http://127.0.0.1:9") as (url, _app):
            port = int(url.rpartition(":")[2])
            wrong = await unrefused(url, page_attacks(port, writes, reads))
            assert (await statuses(url))["/admin/regions"] == 200
    assert wrong == []


@pytest.mark.asyncio
async def test_a_token_does_not_let_a_web_page_in(tmp_path) -> None:
    """With an admin token the browser holds none; still, a request with an `Origin` or a
    body that is not JSON is refused, token or not. The `Host` may be any name then (a
    load balancer's, an operator's DNS name)."""
    async with scripted_backend(RecordingEngine()) as url:
        async with router_server(
            secure_toml(url, top=f'admin_token = "{TOKEN}"'), tmp_path
        ) as server:
            admin = f"http://127.0.0.1:{server.admin_port}"
            origin = {**GOOD, "Origin": f"http://{EVIL}"}
            plain = {**GOOD, "Content-Type": "text/plain"}
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    admin + "/admin/keys", headers=origin, json={"key": PAGE_KEY, "tenant": "m"}
                ) as r:
                    assert r.status == 403, await r.text()
                async with s.get(admin + "/admin/config", headers=origin) as r:
                    assert r.status == 403, await r.text()
                async with s.post(admin + "/admin/keys", headers=plain, data=KEY_BODY) as r:
                    assert r.status == 415, await r.text()
                named = {**GOOD, "Host": f"router-1.internal:{server.admin_port}"}
                async with s.get(admin + "/admin/backends", headers=named) as r:
                    assert r.status == 200, await r.text()
            assert key_digest(PAGE_KEY) not in server.servable.proxy.front.tenants.quotas.keys


@pytest.mark.asyncio
async def test_a_web_page_cannot_use_the_workers_one_admin_listener(tmp_path) -> None:
    """`--workers 2`: the parent's admin listener, which hands writes to every worker."""
    with workers_router(tmp_path) as admin:
        admin_port = int(admin.rpartition(":")[2])
        ready = lambda: asyncio.to_thread(http_ok, admin + "/readyz")  # noqa: E731
        await async_wait_for(ready, 60, "both workers ready")
        writes = [("POST", "/admin/keys", KEY_BODY),
                  ("POST", "/admin/backends", BACKEND_BODY.encode())]  # fmt: skip
        reads = ["/admin/config", "/admin/backends", "/metrics"]
        wrong = await unrefused(admin, page_attacks(admin_port, writes, reads))
        keys = await asyncio.to_thread(urllib.request.urlopen, admin + "/admin/keys")
        backends = await asyncio.to_thread(urllib.request.urlopen, admin + "/admin/backends")
        assert key_digest(PAGE_KEY) not in keys.read().decode()
        assert len(json.load(backends)["backends"]) == 1
    assert wrong == []
