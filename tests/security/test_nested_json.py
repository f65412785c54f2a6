"""Deeply nested JSON (issue 42 finding 9). orjson reads up to 1,024 levels but writes at
most 255, so a body nested 300-1,000 deep passed the parse and broke the router where it
writes the body again (a stream's usage asked for, an alias's model set, a Responses turn
expanded): 500 with a traceback. Both tiers refuse it when they parse it: 400 in the
route's error format, naming the limit."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from support.global_tier import global_over
from support.live import MODEL, FakeEngineProcess, router_server
from support_security import secure_toml

from gpuroute.openai_api import MAX_JSON_DEPTH

pytestmark = pytest.mark.asyncio

ALIAS = "chat-alias"
MODELS = f'[[models]]\nname = "{MODEL}"\naliases = ["{ALIAS}"]\n'
DEPTHS = (300, 1000)  # past orjson's 255 levels on writing, within its 1,024 on reading


def nested(depth: int) -> str:
    """A JSON value `depth` levels deep (arrays and objects in turn), as text."""
    opens = "".join('{"a":' if i % 2 else "[" for i in range(depth))
    closes = "".join("}" if i % 2 else "]" for i in reversed(range(depth)))
    return opens + "0" + closes


def bodies(depth: int) -> dict[str, tuple[str, str]]:
    """Each case: (path, body) with the nesting in a field engines take (a JSON schema)."""
    deep = nested(depth - 1)  # inside the body's own object: `depth` levels in all
    messages = f'"messages":[{{"role":"user","content":"hi"}}],"max_tokens":4,"metadata":{deep}'
    return {
        "streamed chat": (
            "/v1/chat/completions",
            f'{{"model":"{MODEL}",{messages},"stream":true}}',
        ),
        "alias": ("/v1/chat/completions", f'{{"model":"{ALIAS}",{messages}}}'),
        "responses": ("/v1/responses", f'{{"model":"{MODEL}","input":"hi","metadata":{deep}}}'),
        "messages": ("/v1/messages", f'{{"model":"{MODEL}",{messages}}}'),
    }


def refused_as_too_deep(path: str, status: int, answer: dict) -> None:
    assert status == 400, (path, status, answer)
    if path == "/v1/messages":  # Anthropic's error format there
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    else:
        assert answer["error"]["type"] == "invalid_request_error", answer
    assert f"nesting deeper than {MAX_JSON_DEPTH} levels" in answer["error"]["message"], answer


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]
    assert "Traceback" not in caplog.text


async def post(s: aiohttp.ClientSession, url: str, body: str) -> tuple[int, dict | str]:
    """(status, the JSON answer, or a stream's text)."""
    async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        if r.content_type == "text/event-stream":
            return r.status, await r.text()
        return r.status, await r.json(content_type=None)


@pytest.fixture(scope="module")
def engine():
    fake = FakeEngineProcess("H100", time_scale=0.01)
    yield fake
    fake.stop()


async def test_deep_nesting_gets_a_400_naming_the_limit_at_the_router(
    tmp_path, caplog, engine
) -> None:
    caplog.set_level(logging.INFO)
    text = secure_toml(engine.url, top=MODELS)
    async with router_server(text, tmp_path) as server, aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{server.port}"
        for depth in DEPTHS:
            for path, body in bodies(depth).values():
                status, answer = await post(s, base + path, body)
                refused_as_too_deep(path, status, answer)
        for case, (path, body) in bodies(MAX_JSON_DEPTH).items():  # at the limit: served
            status, answer = await post(s, base + path, body)
            assert status == 200, (case, answer)
    no_traceback(caplog)


async def test_deep_nesting_gets_a_400_naming_the_limit_at_the_global_tier(
    tmp_path, caplog, engine
) -> None:
    caplog.set_level(logging.INFO)
    text = secure_toml(engine.url, top=MODELS)
    async with (
        router_server(text, tmp_path) as router,
        global_over(tmp_path, {"eu-west": f"http://127.0.0.1:{router.port}"}) as (url, _),
        aiohttp.ClientSession() as s,
    ):
        for depth in DEPTHS:
            for path, body in bodies(depth).values():
                status, answer = await post(s, url + path, body)
                refused_as_too_deep(path, status, answer)
        path, body = bodies(MAX_JSON_DEPTH)["streamed chat"]
        assert (await post(s, url + path, body))[0] == 200
    no_traceback(caplog)
