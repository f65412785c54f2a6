"""Admin surfaces (issue 30 item 13): the router's and the global tier's admin listeners
had no auth, `check-config` accepted one on 0.0.0.0 without a token, and the Terraform
templates bound 0.0.0.0:9090. Now an admin listener off loopback needs `admin_token`, and
with a token `/metrics` and `/admin/*` ask for it (`/healthz`, `/readyz` stay open)."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

import aiohttp
import pytest
from support.global_tier import global_tier
from support.live import (
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
from support_security import RecordingEngine, secure_toml

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


def test_the_one_admin_listener_of_several_workers_needs_the_token(tmp_path) -> None:
    with fake_engines(("L4", 1.0)) as (engine,):
        port, admin_port = free_port(), free_port()
        text = router_toml([(engine.url, "L4")], port=port, admin_listen=f"port = {admin_port}")
        text = f'admin_token = "{TOKEN}"\n' + text.replace("admin_on_public_listener = true\n", "")
        (tmp_path / "router.toml").write_text(text)
        router = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(tmp_path / "router.toml"), "--workers", "2"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            admin = f"http://127.0.0.1:{admin_port}"
            wait_for(lambda: http_ok(admin + "/readyz"), 60, "both workers ready")
            assert status_of(admin + "/metrics") == 401
            assert status_of(admin + "/admin/backends") == 401
            assert status_of(admin + "/metrics", GOOD) == 200
            assert status_of(admin + "/admin/backends", GOOD) == 200
        finally:
            router.terminate()
            router.wait(30)
