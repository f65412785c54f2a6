"""Issue 42 finding 6: a key bound to class `low` sent `priority: -1000000` (vLLM's
`--scheduling-policy priority` queue: past the router's class cap), `kv_transfer_params`
naming a remote host and `request_id` (vLLM's Responses id), and all three reached the
engine as sent. Fields only the router may set are now refused on every API route (400 in
the route's format, naming the field) unless the key is allowed them."""

from __future__ import annotations

import io
import json
import wave

import aiohttp
import pytest
from gpuroute.router.config.body_fields import ROUTER_ONLY
from support.fake_engine_app import audio_form
from support.live import router_server, scripted_backend
from support_security import KEY, MODEL, RecordingEngine, keys_section, secure_toml
from test_api_routes import BODIES

from gpuroute.openai_api import API_ROUTES

# every JSON API route (audio uploads are forms: the last test sends those)
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
# a value of the engine's type for each of the other router-only fields
SAMPLE = {
    "ec_transfer_params": {"remote_host": "203.0.113.9"},
    "cache_salt": "another-tenants-salt",
    "vllm_xargs": {"kv_connector": "x"},
    "rid": "chosen-by-the-tenant",
    "bootstrap_host": "203.0.113.9",
    "bootstrap_port": 8998,
    "bootstrap_room": 7,
    "data_parallel_rank": 0,
    "routed_dp_rank": 0,
    "disagg_prefill_dp_rank": 0,
    "custom_logit_processor": '{"callable": "<serialized>"}',
    "extra_key": "another-tenants-key",
    "lora_path": "big-model-adapter",
    "session_params": {"id": "another-tenants-session", "rid": "r1"},
    "input_ids": [1, 2, 3] * 100,
}
FIELDS = {**ATTACK, **SAMPLE}  # each router-only field (checked below), with its value


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


@pytest.mark.parametrize("field", sorted(FIELDS))
async def test_router_only_fields_are_refused_on_every_route(tmp_path, field) -> None:
    low = keys_section('priority = "low"')
    answers, engine = await _send(tmp_path, low, {field: FIELDS[field]})
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


async def test_every_router_only_field_is_sent_above() -> None:
    """The deny-list and the fields the test above sends agree (a field added to one is
    added to the other)."""
    assert set(FIELDS) == set(ROUTER_ONLY)


def silence_wav(seconds: int = 1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 16000 * seconds)
    return out.getvalue()


async def test_an_audio_upload_form_is_held_to_the_same_list(tmp_path) -> None:
    """The engine reads an upload's form fields as it reads a JSON body's (vLLM's
    transcription request declares `vllm_xargs`): refused alike on both audio routes,
    unless the key is allowed the field."""
    engine = RecordingEngine()
    paths = [path for path in API_ROUTES if "/audio/" in path]
    async with scripted_backend(engine) as url:
        for extra, status in (("", 400), ('allow_body_fields = ["vllm_xargs"]', 200)):
            text = secure_toml(url, auth=keys_section(extra))
            async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
                for path in paths:
                    form = audio_form(silence_wav(), model=MODEL, vllm_xargs='{"x": 1}')
                    headers = {"Authorization": f"Bearer {KEY}"}
                    async with s.post(
                        f"http://127.0.0.1:{server.port}{path}", data=form, headers=headers
                    ) as r:
                        answer = await r.json()
                        assert r.status == status, (path, answer)
                    if status == 400:
                        assert answer["error"]["param"] == "vllm_xargs", answer
                        assert answer["error"]["code"] == "router_only_field"
                        assert engine.seen == []
    assert sorted(p for p, _, _ in engine.seen) == sorted(paths)
    assert all(b"vllm_xargs" in body for _, _, body in engine.seen)
