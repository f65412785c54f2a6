"""Every limit on every route (issue 42, findings 4 and 8): each cell of
router/api/table.py's `route_limits()` table, which docs/security.md prints ("Limits on every
route"), checked against a live router and engine. The free routes (`/tokenize`,
`count_tokens`) served 20 of 20 requests past a spent per-minute budget and 8 concurrent
2 MB bodies past `max_in_flight = 1`, took a priority header as sent and set no tenant; the
stored responses' by-id routes served 400 of 400 GETs on a spent key. Now every route takes
a request from the per-minute budget and an in-flight slot; only the token quota is left
to the routes that charge it."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from gpuroute.router.api.table import PASSTHROUGH, RESPONSE_BY_ID, RouteLimits, route_limits
from support.fake_engine_app import audio_form, wav
from support.live import MODEL, async_wait_for, holds, router_server, scripted_backend
from support_security import RecordingEngine, chat, secure_toml

from gpuroute.anthropic_errors import ANTHROPIC_ROUTES
from gpuroute.auth import key_digest

pytestmark = pytest.mark.asyncio
ROWS = route_limits()
MAX_BODY = 4096
PASS_PATH = "/v1/load_lora_adapter"  # the passthrough path configured here
# one key per limit under test: its tenant and its `[[auth.keys]]` lines
KEYS = {
    "plain": "",
    "rpm": "requests_per_minute = 1",
    "one": "max_in_flight = 1",
    "tpm": "tokens_per_minute = 1",  # no request that is charged tokens fits
    "low": 'priority = "low"',
    "picky": 'models = ["another-model"]',  # may not use MODEL
}
BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello"}]},
    "/v1/completions": {"prompt": "hello there"},
    "/v1/responses": {"input": "hello there"},
    "/v1/messages": {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/rerank": {"query": "q", "documents": ["a", "b"]},
    "/rerank": {"query": "q", "documents": ["a", "b"]},
    "/v2/rerank": {"query": "q", "documents": ["a", "b"]},
    "/v1/score": {"text_1": "a", "text_2": "b"},
    "/score": {"text_1": "a", "text_2": "b"},
    "/tokenize": {"prompt": "hello there"},
    "/detokenize": {"tokens": [1, 2, 3]},
    PASS_PATH: {"lora_name": "adapter-of-forty-characters-or-so-long"},
}


def row_id(row: RouteLimits) -> str:
    return f"{row.method} {row.path}"


def keys_toml() -> str:
    lines = ["required = true"]
    for tenant, extra in KEYS.items():
        lines.append(f'[[auth.keys]]\nsha256 = "{key_digest("sk-" + tenant)}"\ntenant = "{tenant}"')
        lines += [extra] if extra else []
    return "\n".join(lines)


def config(url: str) -> str:
    top = f'passthrough_paths = ["{PASS_PATH}"]'
    return secure_toml(url, top=top, auth=keys_toml(), limits=f"max_body_bytes = {MAX_BODY}")


def method_path(row: RouteLimits) -> tuple[str, str]:
    if row.path == PASSTHROUGH:
        return "POST", PASS_PATH
    return row.method, row.path.replace("{response_id}", "resp_0123456789abcdef")


async def send(
    s: aiohttp.ClientSession, base: str, row: RouteLimits, tenant: str, *, big: bool = False,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict]:  # fmt: skip
    """The route asked once with `tenant`'s key (`big`: a body over `max_body_bytes`)."""
    method, path = method_path(row)
    sent = {"Authorization": f"Bearer sk-{tenant}", **(headers or {})}
    if path.startswith("/v1/audio/"):
        data = audio_form(wav(1.0 if big else 0.05, rate=8000), model=MODEL)
    elif row.body:
        body = {"model": MODEL, **BODIES.get(path, {"input": "hello there"})}
        if big:
            body["pad"] = "x" * MAX_BODY
        data, sent["Content-Type"] = json.dumps(body), "application/json"
    else:
        data = "x" * MAX_BODY * 2 if big else None
    async with s.request(method, base + path, data=data, headers=sent) as r:
        text = await r.text()
        return r.status, json.loads(text) if text.startswith("{") else {}


def refusal(row: RouteLimits, answer: dict) -> tuple[str, str]:
    """(code, message) of an error answer, in the route's own format."""
    error = answer["error"]
    if row.path in ANTHROPIC_ROUTES:  # Anthropic's: a type, never OpenAI's code
        assert answer["type"] == "error", answer
        return error["type"], error["message"]
    return error["code"], error["message"]


@pytest_asyncio.fixture
async def live(tmp_path):
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        async with router_server(config(url), tmp_path) as server, aiohttp.ClientSession() as s:
            yield engine, server, s, f"http://127.0.0.1:{server.port}"


@pytest.mark.parametrize("row", ROWS, ids=row_id)
async def test_a_spent_per_minute_budget_refuses_every_route(live, row: RouteLimits) -> None:
    _, _, s, base = live
    first, _ = await send(s, base, row, "rpm")
    assert first != 429
    status, answer = await send(s, base, row, "rpm")
    assert status == 429, answer
    code, message = refusal(row, answer)
    assert code in ("rate_limit_exceeded", "rate_limit_error") and "requests per minute" in message


@pytest.mark.parametrize("row", ROWS, ids=row_id)
async def test_a_key_at_its_in_flight_cap_is_refused_on_every_route(live, row) -> None:
    """The key's one slot is held by a chat at the engine: the route is refused, and its
    request never reaches the engine."""
    engine, _, s, base = live
    engine.hold = asyncio.Event()
    held = asyncio.create_task(send(s, base, ROWS[0], "one"))
    await async_wait_for(holds(lambda: engine.started == 1), what="the chat at the engine")
    try:
        async with asyncio.timeout(10):  # let in, it would wait at the held engine
            status, answer = await send(s, base, row, "one")
    finally:
        engine.hold.set()
    assert (await held)[0] == 200
    assert status == 429, answer
    code, message = refusal(row, answer)
    assert code in ("concurrency_limit_exceeded", "rate_limit_error"), code
    assert "in flight" in message and engine.started == 1


@pytest.mark.parametrize("row", ROWS, ids=row_id)
async def test_the_token_quota_is_charged_where_the_table_says(live, row) -> None:
    """A key whose token quota fits no charged request: refused where the route charges
    tokens, served (or answered as any key would be) where it does not."""
    _, _, s, base = live
    status, answer = await send(s, base, row, "tpm")
    if row.tokens:
        assert status == 429, answer
        assert "tokens per minute" in refusal(row, answer)[1]
    else:
        assert status != 429, answer


@pytest.mark.parametrize("row", ROWS, ids=row_id)
async def test_a_body_over_the_limit_is_refused_where_a_body_is_read(live, row) -> None:
    engine, _, s, base = live
    status, answer = await send(s, base, row, "plain", big=True)
    if row.body:
        assert status == 413, answer
        _, message = refusal(row, answer)
        assert f"exceeds {MAX_BODY} bytes" in message
        assert engine.started == 0
    else:  # never read: the route answers as it would without it
        assert status in (200, 404), answer


@pytest.mark.parametrize("row", ROWS, ids=row_id)
async def test_a_priority_above_the_keys_class_is_capped(live, row) -> None:
    """A `low` key asking for `high`: a queued route's request runs as `low`, under its
    tenant (fair queuing); a route answered by the router takes the header as nothing."""
    engine, server, s, base = live
    asking = {"x-gpuroute-priority": "high"}
    if not row.queued:
        status, answer = await send(s, base, row, "low", headers=asking)
        assert status in (200, 404), answer
        return
    engine.hold = asyncio.Event()
    task = asyncio.create_task(send(s, base, row, "low", headers=asking))
    await async_wait_for(holds(lambda: engine.started == 1), what="the request at the engine")
    lives = list(server.servable.lifetimes)
    engine.hold.set()
    await task
    assert [(life.info.tenant, life.info.priority) for life in lives] == [("low", "low")]


class HeldEngine:
    """Counts each request as it arrives, reads its body whatever its size, and answers
    once released."""

    def __init__(self) -> None:
        self.started, self.hold = 0, asyncio.Event()

    async def __call__(self, request: web.Request) -> web.Response:
        self.started += 1
        async for _ in request.content.iter_chunked(1 << 16):
            pass
        await self.hold.wait()
        return web.json_response({"count": 1, "max_model_len": 4096, "tokens": [1]})


async def test_eight_concurrent_2_mb_tokenize_calls_pass_one_in_flight_slot_once(tmp_path):
    """Finding 4's attack as it was run: 8 concurrent 2 MB `/tokenize` bodies on a key
    with `max_in_flight = 1`; all 8 reached the engine."""
    engine = HeldEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, auth=keys_toml())
        async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
            body = json.dumps({"model": MODEL, "prompt": "a " * 1_000_000})
            headers = {"Authorization": "Bearer sk-one", "Content-Type": "application/json"}
            url = f"http://127.0.0.1:{server.port}/tokenize"
            tasks = [asyncio.create_task(s.post(url, data=body, headers=headers)) for _ in range(8)]
            await async_wait_for(
                holds(lambda: engine.started + sum(t.done() for t in tasks) == 8),
                what="each call refused or at the engine",
            )
            engine.hold.set()
            statuses = sorted([(await t).status for t in tasks])
    assert engine.started == 1 and statuses == [200] + [429] * 7


async def test_a_follow_up_on_a_spent_key_is_refused_before_its_conversation_is_read(live):
    """Finding 8: a follow-up's `previous_response_id` was read from the store (up to
    3.2 MB from Redis) before the per-minute check; a spent key's follow-up naming an
    unknown id got the store's 404, not the quota's 429."""
    _, _, s, base = live
    headers = {"Authorization": "Bearer sk-rpm", "Content-Type": "application/json"}
    body = {"model": MODEL, "input": "and then?", "previous_response_id": "resp_unknown"}
    async with s.post(base + "/v1/responses", data=chat(), headers=headers) as r:
        assert r.status != 429
    async with s.post(base + "/v1/responses", data=json.dumps(body), headers=headers) as r:
        assert r.status == 429, await r.text()


def store_reads(server, monkeypatch) -> list[str]:
    """The ids the router reads from its stored responses from here on."""
    store = server.servable.responses.store
    reads, read = [], store.get

    async def counted(tenant: str, rid: str):
        reads.append(rid)
        return await read(tenant, rid)

    monkeypatch.setattr(store, "get", counted)
    return reads


async def test_a_follow_up_refused_by_its_body_or_cap_reads_no_conversation(live, monkeypatch):
    """Issue 42 B3: a follow-up's stored conversation (up to 3.2 MB from Redis) was read
    before the checks that need only the client's body: a router-only field, a model the
    key may not use, and a key at its in-flight cap all got the store's 404 for an unknown
    id. Each is refused now with nothing read from the store; a plain follow-up reads it."""
    engine, server, s, base = live
    reads = store_reads(server, monkeypatch)
    follow = {"model": MODEL, "input": "and then?", "previous_response_id": "resp_" + "0" * 32}

    async def follow_up(tenant: str, **extra) -> tuple[int, str | None]:
        headers = {"Authorization": f"Bearer sk-{tenant}", "Content-Type": "application/json"}
        data = json.dumps(follow | extra)
        async with s.post(base + "/v1/responses", data=data, headers=headers) as r:
            return r.status, (await r.json())["error"]["code"]

    assert await follow_up("plain", priority=-100) == (400, "router_only_field")
    assert await follow_up("picky") == (403, "model_not_allowed")
    engine.hold = asyncio.Event()
    held = asyncio.create_task(send(s, base, ROWS[0], "one"))
    await async_wait_for(holds(lambda: engine.started == 1), what="the chat at the engine")
    try:
        at_cap = await follow_up("one")
    finally:
        engine.hold.set()
    assert (await held)[0] == 200
    assert at_cap == (429, "concurrency_limit_exceeded")
    assert reads == []
    assert await follow_up("plain") == (404, "response_not_found")  # read, and not there
    assert reads == [follow["previous_response_id"]]


async def test_stored_response_routes_write_access_lines_refusals_included(live, caplog):
    """Finding 8: GET and DELETE by id wrote no access-log line, not even a refused
    cross-tenant DELETE."""
    _, _, s, base = live
    caplog.set_level(logging.INFO, logger="gpuroute.access")
    path = base + RESPONSE_BY_ID.replace("{response_id}", "resp_someone_elses")
    for method in ("GET", "DELETE"):
        async with s.request(method, path, headers={"Authorization": "Bearer sk-low"}) as r:
            assert r.status == 404
    lines = [r for r in caplog.records if r.name == "gpuroute.access"]
    seen = [(r.method, r.route, r.status, r.tenant) for r in lines]  # type: ignore[attr-defined]
    assert seen == [(m, RESPONSE_BY_ID, 404, "low") for m in ("GET", "DELETE")]
