"""Issue 42 finding 6: a key bound to class `low` sent `priority: -1000000` (vLLM's
`--scheduling-policy priority` queue: past the router's class cap), `kv_transfer_params`
naming a remote host and `request_id` (vLLM's Responses id), and all three reached the
engine as sent. Fields only the router may set are now refused on every API route (400 in
the route's format, naming the field) unless the key is allowed them."""

from __future__ import annotations

import json

import aiohttp
import pytest
from support.live import router_server, scripted_backend
from support_security import KEY, MODEL, RecordingEngine, keys_section, secure_toml
from test_api_routes import BODIES

from gpuroute.openai_api import API_ROUTES

# every JSON API route (audio uploads are forms: their fields are not the engine's body)
ROUTES = [path for path in API_ROUTES if "/audio/" not in path]
JSON_BODIES = {
    **BODIES,
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/detokenize": {"tokens": [1, 2]},
    "/rerank": BODIES["/v1/rerank"],
    "/v2/rerank": BODIES["/v1/rerank"],
    "/score": BODIES["/v1/score"],
}
pytestmark = pytest.mark.asyncio
AUTH = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
ATTACK = {
    "priority": -1_000_000,
    "kv_transfer_params": {"remote_host": "203.0.113.9", "remote_port": 5557},
    "request_id": "chosen-by-the-tenant",
}


async def _send(tmp_path, keys: str, fields: dict) -> tuple[list, RecordingEngine]:
    """Each API route asked once with `fields` added: (status, answer) per route."""
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, auth=keys)
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{server.port}"
            answers = []
            for path in ROUTES:
                body = {"model": MODEL, **JSON_BODIES.get(path, {"input": "x"}), **fields}
                async with s.post(base + path, data=json.dumps(body), headers=AUTH) as r:
                    answers.append((path, r.status, await r.json()))
    return answers, engine


@pytest.mark.parametrize("field", sorted(ATTACK))
async def test_router_only_fields_are_refused_on_every_route(tmp_path, field) -> None:
    low = keys_section('priority = "low"')
    answers, engine = await _send(tmp_path, low, {field: ATTACK[field]})
    for path, status, answer in answers:
        assert status == 400, (path, answer)
        if path.startswith("/v1/messages"):  # Anthropic's format there
            assert answer["error"]["type"] == "invalid_request_error"
            assert f"'{field}'" in answer["error"]["message"]
        else:
            assert answer["error"]["param"] == field, answer
            assert answer["error"]["code"] == "router_only_field"
    assert engine.seen == []


async def test_a_key_allowed_the_fields_sends_them(tmp_path) -> None:
    allowed = 'allow_body_fields = ["priority", "kv_transfer_params", "request_id"]'
    answers, engine = await _send(tmp_path, keys_section(allowed), ATTACK)
    assert [status for _, status, _ in answers] == [200] * len(ROUTES), answers
    for _, _, body in engine.seen:
        sent = json.loads(body)
        assert {k: sent[k] for k in ATTACK} == ATTACK


async def test_the_anonymous_tenant_is_held_to_the_same_list(tmp_path) -> None:
    """Keyless callers (no keys configured) are the anonymous tenant: refused alike, unless
    `[auth.anonymous] allow_body_fields` names the field."""
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        for extra, status in (("", 400), ('allow_body_fields = ["cache_salt"]', 200)):
            text = secure_toml(url, auth=f"[auth.anonymous]\n{extra}")
            async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
                base = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "cache_salt": "another-tenants-salt",
                }
                headers = {"Content-Type": "application/json"}
                async with s.post(base, data=json.dumps(body), headers=headers) as r:
                    assert r.status == status, await r.text()
    assert len(engine.seen) == 1
    assert json.loads(engine.seen[0][2])["cache_salt"] == "another-tenants-salt"
