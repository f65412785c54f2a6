"""A stream whose region breaks mid-answer (its router dies, or falls silent past
`limits.idle_timeout_s`) goes on in another region the request's residency allows (issue
35 item 2), spliced into the client's stream as the router splices one whose engine broke:
the same id, no second role chunk, one finish, usage for the whole answer. Each attempt
carries its own signed decision. What cannot be continued faithfully, or has no allowed
region left, ends with the explicit error event. Here each region's 'router' is a scripted
server speaking OpenAI's SSE (tests/integration/test_global_continuation_live.py kills real
routers)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.broken_streams import (
    AFTER,
    BEFORE,
    BOUNDED,
    DyingThenHealthy,
    RefusesTheContinuation,
    assert_one_answer,
    chat_text,
    chunk,
)
from support.global_tier import DECISION_KEY, EU_KEY, FIRST, RESIDENCY, global_over
from support.live import MODEL, STREAM_BROKE, counter, scripted_backend, stream_error

from gpuroute.residency_decision import HEADER as DECISION_HEADER
from gpuroute.residency_decision import verify

pytestmark = pytest.mark.asyncio
CHAT = {"model": MODEL, "stream": True, "max_tokens": 5, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "count for me"}]}  # fmt: skip


@contextlib.asynccontextmanager
async def regions(tmp_path, eu_west, us_east, extra: str = ""):
    """The global tier in front of two scripted 'routers': eu-west (eu) and us-east (us)."""
    async with scripted_backend(eu_west) as eu, scripted_backend(us_east) as us:
        async with global_over(tmp_path, {"eu-west": eu, "us-east": us}, extra) as tier:
            yield tier


async def stream(url: str, body: dict, **headers: str) -> bytes:
    async with aiohttp.ClientSession(timeout=BOUNDED) as s:
        async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
            return await r.read()


def counted(app, reason: str, outcome: str) -> float:
    return counter(app, "gpuroute_global_stream_continuations", reason=reason, outcome=outcome)


def served(app, region: str, reason: str) -> float:
    return counter(app, "gpuroute_global_requests", region=region, reason=reason)


async def test_a_stream_whose_region_breaks_goes_on_in_another_as_one_answer(tmp_path) -> None:
    engine = DyingThenHealthy()
    async with regions(tmp_path, engine, engine, RESIDENCY) as (url, app):
        raw = await stream(url, CHAT, **FIRST)
        assert counted(app, "region_broke", "continued") == 1
        assert (served(app, "eu-west", "hint"), served(app, "us-east", "continuation")) == (1, 1)
    assert_one_answer(raw, engine, CHAT["max_tokens"])
    # each attempt its own decision (a router accepts a nonce once), anywhere allowed
    decisions = [verify(h[DECISION_HEADER], DECISION_KEY.encode(), time.time())
                 for h in engine.headers]  # fmt: skip
    assert len({d.nonce for d in decisions}) == 2
    assert all(d.jurisdictions is None for d in decisions)


class FallsSilent(DyingThenHealthy):
    """Streams BEFORE, then says nothing more (a router hung, its connection open)."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk("cmpl-a", 111, {"role": "assistant", "content": ""}))
        for piece in BEFORE:
            await response.write(chunk("cmpl-a", 111, {"content": piece}))
        await asyncio.Event().wait()  # until the global tier hangs up (handler cancelled)
        return response


async def test_a_region_silent_past_the_idle_limit_is_continued_elsewhere(tmp_path) -> None:
    silent, healthy = FallsSilent(), DyingThenHealthy()
    limits = "[limits]\nidle_timeout_s = 0.5\n"
    async with regions(tmp_path, silent, healthy, limits) as (url, app):
        raw = await stream(url, CHAT, **FIRST)
        assert counted(app, "region_broke", "continued") == 1
    assert chat_text(raw) == "".join(BEFORE + AFTER) and raw.endswith(b"data: [DONE]\n\n")
    assert len(silent.bodies) == 1 and len(healthy.bodies) == 1
    assert healthy.bodies[0]["messages"][-1] == {"role": "assistant", "content": "".join(BEFORE)}


async def test_residency_comes_first_with_no_allowed_region_left_the_error(tmp_path) -> None:
    """An EU-only tenant whose only EU region breaks: the error event, and us-east (up,
    and serving the model) never sees the request."""
    dying, elsewhere = DyingThenHealthy(), DyingThenHealthy()
    async with regions(tmp_path, dying, elsewhere, RESIDENCY) as (url, app):
        raw = await stream(url, CHAT, Authorization=f"Bearer {EU_KEY}")
        assert counted(app, "no_region", "ended") == 1
        assert served(app, "us-east", "continuation") == 0
    error = stream_error(raw, raw[: raw.rindex(b'data: {"error"')])
    assert error.pop("message") == "region eu-west failed mid-stream" and error == STREAM_BROKE
    assert len(dying.bodies) == 1 and elsewhere.bodies == []
    eu_only = verify(dying.headers[0][DECISION_HEADER], DECISION_KEY.encode(), time.time())
    assert eu_only.jurisdictions == frozenset({"eu"})


@pytest.mark.parametrize(
    ("extra", "config", "reason"),
    [
        ({"n": 2}, "", "n"),
        ({"seed": 7}, "", "seed"),
        ({"logprobs": True}, "", "logprobs"),
        ({"response_format": {"type": "json_object"}}, "", "guided_decoding"),
        ({}, "[continuation]\nenabled = false\n", "disabled"),
    ],
)
async def test_what_cannot_be_continued_faithfully_ends_with_the_error(
    tmp_path, extra, config, reason
) -> None:
    dying, elsewhere = DyingThenHealthy(), DyingThenHealthy()
    async with regions(tmp_path, dying, elsewhere, config) as (url, app):
        raw = await stream(url, {**CHAT, **extra}, **FIRST)
        assert counted(app, reason, "ended") == 1
    relayed = raw[: raw.rindex(b'data: {"error"')]
    assert stream_error(raw, relayed)["code"] == "upstream_stream_error"
    assert chat_text(relayed) == "".join(BEFORE) and elsewhere.bodies == []


async def test_a_continuation_the_next_region_refuses_ends_with_the_error(tmp_path) -> None:
    dying, refusing = DyingThenHealthy(), RefusesTheContinuation()
    async with regions(tmp_path, dying, refusing) as (url, app):
        raw = await stream(url, CHAT, **FIRST)
        assert counted(app, "refused", "ended") == 1
    relayed = raw[: raw.rindex(b'data: {"error"')]
    assert stream_error(raw, relayed)["code"] == "upstream_stream_error"  # never spliced
    assert b"too long" not in raw and len(refusing.bodies) == 1


async def test_a_continuation_is_an_event_of_the_global_tiers_span(tmp_path) -> None:
    engine, spans = DyingThenHealthy(), InMemorySpanExporter()
    tracing = '[tracing]\notlp_endpoint = "http://127.0.0.1:9/v1/traces"\n'
    async with scripted_backend(engine) as eu, scripted_backend(engine) as us:
        routers = {"eu-west": eu, "us-east": us}
        async with global_over(tmp_path, routers, tracing + RESIDENCY, spans) as (url, _app):
            raw = await stream(url, CHAT, **FIRST)
    assert_one_answer(raw, engine, CHAT["max_tokens"])
    (span,) = spans.get_finished_spans()
    (went_on,) = [e for e in span.events if e.name == "continuation"]
    assert dict(went_on.attributes) == {"gpuroute.continuation": 1,
                                        "gpuroute.tokens_before": len(BEFORE),
                                        "gpuroute.region": "us-east"}  # fmt: skip


@pytest.mark.parametrize("error_event", [False, True])
async def test_a_client_that_did_not_ask_for_usage_gets_none(tmp_path, error_event) -> None:
    """The continuation asks its region for usage (to splice the whole answer's); the
    global tier strips it for a client that did not ask. A region whose router ended the
    stream with an error event (no backend left there, say) is continued as a broken one."""
    engine = DyingThenHealthy(error_event=error_event)
    body = {k: v for k, v in CHAT.items() if k != "stream_options"}
    async with regions(tmp_path, engine, engine, RESIDENCY) as (url, app):
        raw = await stream(url, body, **FIRST)
        assert counted(app, "region_broke", "continued") == 1
    assert engine.bodies[1]["stream_options"] == {"include_usage": True}
    assert chat_text(raw) == "".join(BEFORE + AFTER)
    assert b'"usage"' not in raw and b'"error"' not in raw
