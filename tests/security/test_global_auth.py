"""The global tier reads keys exactly as routers do (issue 16 item 3): an EU-only key sent
as `bearer ...` in lowercase used to be served in us-east."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import GlobalApp
from support.paths import REPO

from gpuroute.auth import AuthError, bearer, client_key, key_digest
from gpuroute.headers import interpreted
from gpuroute.openai_api import Rejection

EU_KEY = "sk-acme-eu"


def global_app(tmp_path, *, allow_anonymous: bool = False) -> GlobalApp:
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    (tmp_path / "global.toml").write_text(
        'regions_file = "regions.toml"\n'
        '[[endpoints]]\nregion = "eu-west"\nurl = "http://127.0.0.1:1"\nreport = "127.0.0.1:2"\n'
        '[[endpoints]]\nregion = "us-east"\nurl = "http://127.0.0.1:3"\nreport = "127.0.0.1:4"\n'
        f"[residency]\nallow_anonymous = {str(allow_anonymous).lower()}\n"
        'tenants = { acme-eu = ["eu"] }\n'
        f'api_keys = {{ "{key_digest(EU_KEY)}" = "acme-eu" }}\n'
    )
    return GlobalApp(*load_global_config(tmp_path / "global.toml"))


def tenant_of(app: GlobalApp, headers: dict[str, str] | None = None) -> str | None:
    request = make_mocked_request("POST", "/v1/chat/completions", headers=headers or {})
    return app.tenant(interpreted(request.headers.items()), request.remote)


@pytest.mark.parametrize(
    "header",
    [f"Bearer {EU_KEY}", f"bearer {EU_KEY}", f"BEARER {EU_KEY}", f"  Bearer   {EU_KEY} "],
)
def test_every_spelling_of_the_scheme_finds_the_tenant(tmp_path, header: str) -> None:
    app = global_app(tmp_path)
    assert tenant_of(app, {"Authorization": header}) == "acme-eu"
    allowed = app.rules.allowed(tenant=tenant_of(app, {"Authorization": header}))
    assert allowed.permits("eu") and not allowed.permits("us")


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}]
)
def test_no_readable_key_fails_closed(tmp_path, headers: dict) -> None:
    app = global_app(tmp_path)
    with pytest.raises(Rejection) as refused:
        tenant_of(app, headers)
    assert refused.value.status == 401


def test_anonymous_only_when_explicitly_allowed(tmp_path) -> None:
    app = global_app(tmp_path, allow_anonymous=True)
    assert tenant_of(app) is None


def test_both_tiers_share_one_parser() -> None:
    from gpuroute.global_ import server
    from gpuroute.router.front import residency as residency_gate
    from gpuroute.router.shared import quotas

    assert quotas.client_key is server.client_key is residency_gate.client_key is client_key
    with pytest.raises(AuthError) as bad:
        bearer("Bearer \udcff\udcfe")  # non-UTF-8 bytes as aiohttp decodes them
    assert bad.value.status == 400


@pytest.mark.asyncio
async def test_who_is_asking_comes_before_the_body(tmp_path) -> None:
    """Issue 30 item 9: an 8 MB keyless body of 2.7M `{}` was parsed (74 -> 315 MB peak)
    before the 401. Now the 401 comes from the head alone: the body is never read."""
    import asyncio
    import socket

    from support.global_tier import global_tier

    extra = (
        f'[residency]\napi_keys = {{ "{key_digest(EU_KEY)}" = "acme-eu" }}\n'
        "refuse_unknown_keys = true\n"  # api_keys lists every key: a junk one is refused too
    )
    async with global_tier(tmp_path, "http://127.0.0.1:9", extra) as (url, _app):
        port = int(url.rsplit(":", 1)[1])

        def send_a_head_and_a_little(key_line: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    + key_line
                    + b"Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n"
                    + b"["
                    + b"{}," * 1000
                )  # the other 7.99 MB never come
                return s.recv(4096)

        for key_line in (b"", b"Authorization: Bearer junk\r\n"):
            answer = await asyncio.to_thread(send_a_head_and_a_little, key_line)
            assert answer.startswith(b"HTTP/1.1 401"), (key_line, answer[:80])


@pytest.mark.asyncio
async def test_the_model_list_needs_a_key_where_keys_are_required(tmp_path) -> None:
    """Issue 30 item 13: `/v1/models` answered anyone at both tiers."""
    import aiohttp
    from support.global_tier import global_tier
    from support.live import router_server, scripted_backend
    from support_security import KEY, RecordingEngine, keys_section, secure_toml

    async with scripted_backend(RecordingEngine()) as engine:
        text = secure_toml(engine, auth=keys_section())
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{server.port}/v1/models"
            for headers, status in (({}, 401), ({"Authorization": "Bearer junk"}, 401),
                                    ({"Authorization": f"Bearer {KEY}"}, 200)):  # fmt: skip
                async with s.get(url, headers=headers) as r:
                    assert r.status == status, headers
        extra = f'[residency]\napi_keys = {{ "{key_digest(EU_KEY)}" = "acme-eu" }}\n'
        (tmp_path / "g").mkdir()
        async with global_tier(tmp_path / "g", engine, extra) as (url, _app):
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{url}/v1/models") as r:
                    assert r.status == 401
                async with s.get(
                    f"{url}/v1/models", headers={"Authorization": f"Bearer {EU_KEY}"}
                ) as r:
                    assert r.status == 200
