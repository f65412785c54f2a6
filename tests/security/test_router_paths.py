"""Paths beside the main one (issue 16 items 1, 8, 17): no unauthenticated way to an engine,
no topology or internals on the public port, OpenAI-format errors for every refusal."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from gpuroute.router.config.router import load_router_config
from support.global_tier import global_tier
from support.live import router_server, scripted_backend
from support_security import (
    KEY,
    RecordingEngine,
    chat,
    error_of,
    keys_section,
    raw_exchange,
    secure_toml,
    status_of,
)

from gpuroute.config import ConfigError

pytestmark = pytest.mark.asyncio
JSON = {"Content-Type": "application/json"}


async def test_no_path_around_auth_reaches_an_engine(tmp_path) -> None:
    """Item 1: with keys required, the trailing slash, other OpenAI paths, SageMaker's
    /invocations and the fake engine's /_fault all used to reach the engine keyless."""
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, auth=keys_section(required=True))
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}"
            for path in ("/v1/chat/completions/", "/v1/realtime", "/invocations", "/_fault"):
                async with s.post(base + path, data=chat(), headers=JSON) as r:
                    assert r.status == 404, path
                    assert (await r.json())["error"]["code"] == "not_found"
            async with s.post(base + "/v1/chat/completions", data=chat(), headers=JSON) as r:
                assert r.status == 401
    assert engine.seen == []


async def test_allow_listed_passthrough_runs_the_same_checks(tmp_path) -> None:
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(
            url,
            top='passthrough_paths = ["/v1/load_lora_adapter"]',
            auth=keys_section(required=True),
        )
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}/v1/load_lora_adapter"
            async with s.post(base, data=chat(), headers=JSON) as r:
                assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
            assert engine.seen == []
            auth = {**JSON, "Authorization": f"Bearer {KEY}"}
            async with s.post(base, data=chat(), headers=auth) as r:
                assert r.status == 200
            async with s.post(base + "/", data=chat(), headers=auth) as r:
                assert r.status == 404  # exact paths only
    assert engine.paths() == ["/v1/load_lora_adapter"]
    assert "Authorization" not in engine.seen[0][1]  # the client's key stays with us


async def test_admin_and_internals_stay_off_the_public_port(tmp_path) -> None:
    """Item 8: metrics, admin, the backend header, backend addresses and exception text in
    502 bodies, and the Server header naming aiohttp."""
    engine = RecordingEngine(fail_when=lambda body: True)
    async with scripted_backend(engine) as url:
        async with router_server(secure_toml(url), tmp_path) as server:
            public = f"http://127.0.0.1:{server.port}"
            admin = f"http://127.0.0.1:{server.admin_port}"
            async with aiohttp.ClientSession() as s:
                for path in ("/metrics", "/admin/backends"):
                    async with s.get(public + path) as r:
                        assert r.status == 404, path
                async with s.post(public + "/v1/chat/completions", data=chat(), headers=JSON) as r:
                    text = await r.text()
                    assert r.status == 502
                    assert "x-gpuroute-backend" not in r.headers
                    assert r.headers["Server"] == "gpuroute"
                    assert "127.0.0.1" not in text and "status 500" not in text
                async with s.get(admin + "/admin/backends") as r:
                    assert r.status == 200 and len((await r.json())["backends"]) == 1
    assert server.servable.config.admin_listen.host == "127.0.0.1"


async def test_admin_on_the_public_port_only_on_loopback(tmp_path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(
        'admin_on_public_listener = true\n[listen]\nhost = "0.0.0.0"\n'
        '[[backends]]\nurl = "http://10.0.0.1:8000"\ngpu = "H100"\nmodels = ["m"]\n'
    )
    with pytest.raises(ConfigError, match="admin_on_public_listener: allowed only"):
        load_router_config(path)


async def test_malformed_headers_and_methods_get_openai_errors(tmp_path) -> None:
    """Item 17: non-UTF-8 Authorization or session header (was 500 with a traceback), a
    100,000-character model name echoed in the 404, GET on an API route in plain text."""
    async with scripted_backend(RecordingEngine()) as url:
        text = secure_toml(url, auth=keys_section())
        async with router_server(text, tmp_path) as server:
            body = chat()
            bearer = "expected `Authorization: Bearer <key>`"
            for header, expected in (
                (b"Authorization: Bearer \xff\xfe", {
                    "message": f"Authorization header has bytes that are not printable ASCII; "
                               f"{bearer}",
                    "param": None, "code": "invalid_authorization_header",
                }),
                (b"x-session-id: \xff\xfe", {
                    "message": "x-session-id must be printable ASCII",
                    "param": "x-session-id", "code": None,
                }),
            ):  # fmt: skip
                auth = (
                    b""
                    if header.startswith(b"Authorization")
                    else f"Authorization: Bearer {KEY}\r\n".encode()
                )
                request = (
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n" + auth
                    + b"Content-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
                )  # fmt: skip
                answer = await asyncio.to_thread(raw_exchange, server.port, request)
                assert status_of(answer) == 400, answer[:200]
                assert error_of(answer) == expected | {"type": "invalid_request_error"}, answer
            async with aiohttp.ClientSession() as s:
                base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                auth = {**JSON, "Authorization": f"Bearer {KEY}"}
                async with s.post(base, data=chat(model="m" * 100_000), headers=auth) as r:
                    clipped = "m" * 77 + "..."  # 80 characters (docs/security.md, item 17)
                    assert (r.status, await r.json()) == (404, {"error": {
                        "message": f"The model `{clipped}` does not exist.",
                        "type": "not_found_error", "param": "model", "code": "model_not_found",
                    }})  # fmt: skip
                async with s.get(base) as r:
                    assert (r.status, await r.json()) == (405, {"error": {
                        "message": "GET is not allowed on /v1/chat/completions; use POST",
                        "type": "invalid_request_error", "param": None,
                        "code": "method_not_allowed",
                    }})  # fmt: skip


UNPARSEABLE = [
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Content-Length: 6\r\n\r\nhello",
]


async def test_unparseable_requests_get_an_http11_error_naming_no_library(tmp_path) -> None:
    """Issue 30 item 11: a malformed request got `HTTP/1.0 400` with `Server: Python/3.11
    aiohttp/...`, on every listener of both tiers."""
    async with scripted_backend(RecordingEngine()) as url:
        async with router_server(secure_toml(url), tmp_path) as server:
            ports = {"router": server.port, "router admin": server.admin_port}
            (tmp_path / "g").mkdir()
            async with global_tier(tmp_path / "g", url) as (front, _app):
                ports["global"] = int(front.rsplit(":", 1)[1])
                for where, port in ports.items():
                    for payload in UNPARSEABLE:
                        answer = await asyncio.to_thread(raw_exchange, port, payload)
                        head = answer.split(b"\r\n\r\n")[0].lower()
                        assert answer.startswith(b"HTTP/1.1 400 "), (where, answer[:80])
                        assert b"\r\nserver: gpuroute" in head, (where, head)
                        assert b"aiohttp" not in answer.lower() and b"python" not in answer.lower()
                        error = error_of(answer)
                        assert error.pop("message").startswith("malformed HTTP request: ")
                        assert error == {
                            "type": "invalid_request_error", "param": None, "code": "bad_request",
                        }, (where, answer)  # fmt: skip


class CookieSettingEngine(RecordingEngine):
    """An engine (or something in front of it) that sets a cookie on every answer."""

    async def __call__(self, request):
        response = await super().__call__(request)
        response.set_cookie("engine_session", f"secret-for-request-{self.started}")
        return response


async def test_a_cookie_an_engine_set_never_rides_on_another_clients_request(tmp_path) -> None:
    """The router's one client session to the engines kept a cookie jar: a cookie set in
    answer to client A went to the engine with client B's next request."""
    engine = CookieSettingEngine()
    async with scripted_backend(engine) as url:
        # by name: aiohttp's jar keeps no cookies from bare IP addresses
        text = secure_toml(url.replace("127.0.0.1", "localhost"))
        async with router_server(text, tmp_path) as server:
            base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            for _client in ("a", "b"):
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(base, data=chat(), headers=JSON) as r,
                ):
                    assert r.status == 200
    assert len(engine.seen) == 2
    assert "Cookie" not in engine.seen[1][1]


async def test_a_cookie_a_region_set_never_rides_on_another_clients_request(tmp_path) -> None:
    """The global tier's client session to the regions' routers kept a cookie jar too: a
    cookie an engine set (routers pass Set-Cookie on) went to the region with the next
    client's request, and from there to an engine."""
    engine = CookieSettingEngine()
    async with scripted_backend(engine) as url:
        region = url.replace("127.0.0.1", "localhost")  # aiohttp's jar skipped bare IPs
        async with global_tier(tmp_path, region) as (base, _app):
            for _client in ("a", "b"):
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(base + "/v1/chat/completions", data=chat(), headers=JSON) as r,
                ):
                    assert r.status == 200
    assert len(engine.seen) == 2
    assert "Cookie" not in engine.seen[1][1]
