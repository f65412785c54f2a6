"""Metrics and admin live on the admin listener (loopback by default), never on the public
port, and the public port passes no unknown path through to engines."""

from __future__ import annotations

import random

import aiohttp
import pytest
from aiohttp import web
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from support.live import chat_body, free_port, router_toml, scripted_backend

pytestmark = pytest.mark.asyncio


async def engine(request: web.Request) -> web.StreamResponse:
    if request.path == "/secret":
        return web.json_response({"leaked": True})
    return web.json_response(
        {"id": "x", "object": "chat.completion", "choices": [], "usage": {"completion_tokens": 1}}
    )


async def test_admin_routes_live_only_on_the_admin_listener(tmp_path) -> None:
    from gpuroute.router.config.router import load_router_config
    from gpuroute.router.http.server import RouterApp
    from gpuroute.router.process import RouterServer

    async with scripted_backend(engine) as url:
        admin_port = free_port()
        text = router_toml([(url, "H100")], admin_listen=f"port = {admin_port}").replace(
            ROUTER_ON_LOOPBACK, ""
        )
        (tmp_path / "r.toml").write_text(text)
        server = RouterServer(
            RouterApp(load_router_config(tmp_path / "r.toml"), rng=random.Random(0))
        )
        await server.start()
        public, admin = f"http://127.0.0.1:{server.port}", f"http://127.0.0.1:{admin_port}"
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(public + "/v1/chat/completions", json=chat_body()) as r:
                    assert r.status == 200
                for path in ("/metrics", "/admin/backends", "/secret"):
                    async with s.get(public + path) as r:
                        assert r.status == 404, path
                        assert (await r.json())["error"]["code"] == "not_found"
                async with s.get(admin + "/metrics") as r:
                    assert r.status == 200 and "gpuroute_requests_total" in await r.text()
                async with s.get(admin + "/admin/backends") as r:
                    (row,) = (await r.json())["backends"]
                    assert "predicted" not in row  # a prediction per backend only when asked
                asked = "/admin/backends?prompt_tokens=300&output_tokens=64"
                async with s.get(admin + asked) as r:
                    body = await r.json()
                    assert body["predicted_for"]["prompt_tokens"] == 300
                    assert body["backends"][0]["predicted"]["ttft_s"] > 0
                async with s.get(public + asked) as r:
                    assert r.status == 404
                async with s.get(admin + "/admin/backends?prompt_tokens=lots") as r:
                    assert r.status == 400 and (await r.json())["error"]["code"] == "bad_request"
                async with s.get(admin + "/readyz") as r:
                    assert r.status == 200
        finally:
            await server.drain(timeout=1.0)
