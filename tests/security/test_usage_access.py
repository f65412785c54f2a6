"""The usage records (issue 34 item 2) name every tenant and what it used: they are read on
the admin listener only, with the admin token. Without it, or with a wrong one,
`GET /admin/usage` and `POST /admin/usage/flush` are 401 and `gpuroute usage` fails
saying so; the public listener does not serve them at all, whatever key is sent."""

from __future__ import annotations

import asyncio
import subprocess

import aiohttp
import pytest
from support.live import environ_without_proxies, gpuroute_cmd, router_server, scripted_backend
from support_security import KEY, RecordingEngine, chat, keys_section, secure_toml

pytestmark = pytest.mark.asyncio
TOKEN = "admin-usage-secret"


async def status(s: aiohttp.ClientSession, method: str, url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers["Content-Type"] = "application/json"  # as every admin write must be
    async with s.request(method, url, headers=headers) as r:
        body = await r.json()
        if r.status == 401:
            assert body["error"]["code"] == "invalid_admin_token"
        return r.status


def cli(admin: str, *extra: str) -> subprocess.CompletedProcess:
    command = gpuroute_cmd("usage", "--since", "1h", "--json", "--admin-url", admin, *extra)
    env = environ_without_proxies()
    env.pop("GPUROUTE_ADMIN_TOKEN", None)
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


async def test_usage_needs_the_admin_token_and_is_not_on_the_public_port(tmp_path) -> None:
    config = secure_toml("{engine}", top=f'admin_token = "{TOKEN}"', auth=keys_section())
    (tmp_path / "token").write_text(TOKEN + "\n")
    async with scripted_backend(RecordingEngine()) as engine:
        async with router_server(config.replace("{engine}", engine), tmp_path) as server:
            admin = f"http://127.0.0.1:{server.admin_port}"
            public = f"http://127.0.0.1:{server.port}"
            async with aiohttp.ClientSession() as s:
                headers = {"Authorization": f"Bearer {KEY}"}
                async with s.post(public + "/v1/chat/completions", data=chat(), headers=headers):
                    pass
                found = {
                    (method, path, who): await status(s, method, base + path, token)
                    for method, path in (("GET", "/admin/usage?since=1h"),
                                         ("POST", "/admin/usage/flush"))
                    for who, base, token in (("none", admin, None), ("wrong", admin, "guess"),
                                             ("key", public, KEY), ("admin", admin, TOKEN))
                }  # fmt: skip
            refused = await asyncio.to_thread(cli, admin)
            allowed = await asyncio.to_thread(cli, admin, "--token-file", str(tmp_path / "token"))
    for (method, path, who), code in found.items():
        wanted = {"none": 401, "wrong": 401, "key": 404, "admin": 200}[who]
        assert code == wanted, (method, path, who, code)
    assert refused.returncode == 1 and "401: admin token required" in refused.stderr
    assert allowed.returncode == 0, allowed.stderr
    assert '"acme"' in allowed.stdout  # the one request, recorded under its tenant
