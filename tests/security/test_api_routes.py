"""Issue 33's routes and Anthropic's key header: every new API asks for a key as chat does
and never reaches an engine without one; `x-api-key` is a key for both tiers, read once,
never forwarded; two different keys in the two headers are refused, not picked between."""

from __future__ import annotations

import json

import aiohttp
import pytest
from support.live import router_server, scripted_backend
from support_security import KEY, MODEL, RecordingEngine, keys_section, secure_toml
from test_global_auth import EU_KEY, global_app, tenant_of

from gpuroute.auth import AuthError, client_key
from gpuroute.headers import interpreted
from gpuroute.openai_api import API_ROUTES, Rejection

JSON = {"Content-Type": "application/json"}
BODIES = {
    "/v1/responses": {"input": "hi"},
    "/v1/messages": {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/rerank": {"query": "q", "documents": ["a", "b"]},
    "/v1/score": {"text_1": "a", "text_2": "b"},
    "/tokenize": {"prompt": "hi"},
}


@pytest.mark.asyncio
async def test_every_api_route_needs_a_key_and_x_api_key_is_one(tmp_path) -> None:
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, auth=keys_section(required=True))
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}"
            for path in API_ROUTES:
                body = json.dumps({"model": MODEL, **BODIES.get(path, {"input": "x"})})
                async with s.post(base + path, data=body, headers=JSON) as r:
                    assert r.status == 401, path
                    answer = await r.json()
                    if path.startswith("/v1/messages"):  # Anthropic's format there
                        assert answer["type"] == "error", answer
                        assert answer["error"]["type"] == "authentication_error"
                    else:
                        assert answer["error"]["code"] == "invalid_api_key"
            assert engine.seen == []
            for path, extra in BODIES.items():
                body = json.dumps({"model": MODEL, **extra})
                async with s.post(base + path, data=body, headers={**JSON, "x-api-key": KEY}) as r:
                    assert r.status == 200, (path, await r.text())
            two = {**JSON, "x-api-key": KEY, "Authorization": "Bearer sk-someone-else"}
            body = json.dumps({"model": MODEL, **BODIES["/v1/messages"]})
            async with s.post(base + "/v1/messages", data=body, headers=two) as r:
                assert (
                    r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
                )
    assert sorted(p for p, _, _ in engine.seen) == sorted(BODIES)
    for _, headers, _ in engine.seen:  # the client's key stays with us, in either header
        assert not {"x-api-key", "authorization"} & {h.lower() for h in headers}


def test_the_global_tier_reads_x_api_key_for_residency(tmp_path) -> None:
    """An EU-only key sent as x-api-key is the EU tenant at the global tier too (else it
    would be an anonymous request, free of the EU rule, while the router served the key)."""
    app = global_app(tmp_path)
    assert tenant_of(app, {"x-api-key": EU_KEY}) == "acme-eu"
    assert not app.rules.allowed(tenant="acme-eu").permits("us")


def test_two_keys_in_two_headers_are_refused_not_picked() -> None:
    with pytest.raises(Rejection) as twice:  # the one reading of every header (issue 30)
        interpreted([("x-api-key", KEY), ("X-API-Key", KEY)])
    assert twice.value.status == 400 and twice.value.code == "duplicate_header"
    assert client_key({"authorization": f"Bearer {KEY}", "x-api-key": KEY}) == KEY
    with pytest.raises(AuthError) as two:
        client_key({"authorization": f"Bearer {KEY}", "x-api-key": EU_KEY})
    assert two.value.status == 400 and two.value.code == "conflicting_api_keys"
    with pytest.raises(AuthError):
        client_key({"x-api-key": "has a space"})
