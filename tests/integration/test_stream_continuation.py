"""A stream whose engine dies mid-answer goes on on another backend (issue 35 item 1): the
client's stream keeps its id, gets no second role chunk, one finish and usage for the whole
answer; the continuation carries the prompt plus the text so far as the assistant's turn
continued (chat) or appended to the prompt (completions), `max_tokens` less what was sent,
the sampling parameters kept. What cannot be continued faithfully (n > 1, a seed) or has
nowhere to go ends with the explicit error event, never a silent truncation."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI
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
    events,
)
from support.live import (
    MODEL,
    STREAM_BROKE,
    counter,
    router_server,
    router_toml,
    running_router,
    scripted_backend,
    spans_to,
    stream_error,
)

from gpuroute.prompt import prompt_tokens

pytestmark = pytest.mark.asyncio


def counted(router, reason: str, outcome: str) -> float:
    return counter(router, "gpuroute_stream_continuations", reason=reason, outcome=outcome)


async def through_two(engine, body: dict, tmp_path, path: str = "/v1/chat/completions"):
    """`body` sent to a router in front of two backends both running `engine`: what the
    client received, and the router (its metrics)."""
    async with scripted_backend(engine) as one, scripted_backend(engine) as two:
        config = router_toml([(one, "H100"), (two, "H100")])
        async with running_router(config, tmp_path) as (url, router):
            async with aiohttp.ClientSession(timeout=BOUNDED) as s:
                async with s.post(url + path, json=body) as r:
                    assert r.status == 200
                    return await r.read(), router


async def test_a_chat_stream_goes_on_on_another_engine_as_one_answer(tmp_path) -> None:
    engine = DyingThenHealthy()
    body = {"model": MODEL, "stream": True, "max_tokens": 5, "temperature": 0.7, "stop": ["\n\n"],
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count for me"}]}  # fmt: skip
    async with scripted_backend(engine) as one, scripted_backend(engine) as two:
        config = router_toml([(one, "H100"), (two, "H100")])
        async with running_router(config, tmp_path) as (url, router):
            async with aiohttp.ClientSession(timeout=BOUNDED) as s:
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    raw = await r.read()
            assert counted(router, "engine_broke", "continued") == 1
    assert_one_answer(raw, engine, max_tokens=5)
    second = engine.bodies[1]
    assert (second["temperature"], second["stop"]) == (0.7, ["\n\n"])


async def test_the_openai_client_reads_one_complete_answer(tmp_path) -> None:
    engine = DyingThenHealthy()
    async with scripted_backend(engine) as one, scripted_backend(engine) as two:
        async with running_router(router_toml([(one, "H100"), (two, "L4")]), tmp_path) as (url, _):
            client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            pieces, finishes = [], []
            async for part in stream:
                if part.choices:
                    pieces.append(part.choices[0].delta.content or "")
                    finishes.append(part.choices[0].finish_reason)
            await client.close()
    assert "".join(pieces) == "".join(BEFORE + AFTER)
    assert [f for f in finishes if f] == ["stop"]


async def test_a_completions_stream_goes_on_with_the_text_appended(tmp_path) -> None:
    engine = DyingThenHealthy()
    body = {"model": MODEL, "prompt": "Once upon a time", "stream": True, "max_tokens": 9}
    async with scripted_backend(engine) as one, scripted_backend(engine) as two:
        async with running_router(router_toml([(one, "H100"), (two, "H100")]), tmp_path) as (
            url,
            _,
        ):
            async with aiohttp.ClientSession(timeout=BOUNDED) as s:
                async with s.post(url + "/v1/completions", json=body) as r:
                    raw = await r.read()
    texts = [c["choices"][0]["text"] for c in events(raw) if c["choices"]]
    assert "".join(texts) == "".join(BEFORE + AFTER) and b"usage" not in raw  # not asked for
    second = engine.bodies[1]
    assert second["prompt"] == "Once upon a time" + "".join(BEFORE)
    assert second["max_tokens"] == 9 - len(BEFORE)


@pytest.mark.parametrize(
    ("extra", "reason"), [({"n": 2}, "n"), ({"seed": 7}, "seed"), ({"logprobs": True}, "logprobs")]
)
async def test_what_cannot_be_continued_faithfully_ends_with_the_error(
    tmp_path, extra, reason
) -> None:
    engine = DyingThenHealthy()
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}], **extra}
    raw, router = await through_two(engine, body, tmp_path)
    assert counted(router, reason, "ended") == 1
    relayed = raw[: raw.rindex(b'data: {"error"')]
    error = stream_error(raw, relayed)
    assert error.pop("message") == "the backend failed mid-stream" and error == STREAM_BROKE
    assert len(engine.bodies) == 1  # nothing was sent to continue it


async def test_with_nowhere_else_to_go_the_stream_ends_with_the_error(tmp_path) -> None:
    engine = DyingThenHealthy()
    async with scripted_backend(engine) as only:
        async with running_router(router_toml([(only, "H100")]), tmp_path) as (url, router):
            body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]}
            async with aiohttp.ClientSession(timeout=BOUNDED) as s:
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    raw = await r.read()
            assert counted(router, "no_backend", "ended") == 1
    relayed = raw[: raw.rindex(b'data: {"error"')]
    assert stream_error(raw, relayed)["code"] == "upstream_stream_error"


async def test_a_stream_whose_cap_was_spent_ends_with_length_not_a_continuation(tmp_path) -> None:
    engine = DyingThenHealthy()
    body = {"model": MODEL, "stream": True, "max_tokens": len(BEFORE),
            "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    raw, router = await through_two(engine, body, tmp_path)
    assert counted(router, "length", "ended") == 1
    chunks = events(raw)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["id"] == "cmpl-a" and raw.endswith(b"data: [DONE]\n\n")
    assert len(engine.bodies) == 1


async def test_a_continuation_refused_by_its_engine_ends_with_the_error(tmp_path) -> None:
    engine = RefusesTheContinuation()
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    raw, router = await through_two(engine, body, tmp_path)
    assert counted(router, "refused", "ended") == 1
    relayed = raw[: raw.rindex(b'data: {"error"')]
    assert stream_error(raw, relayed)["code"] == "upstream_stream_error"  # never spliced
    assert b"too long" not in raw and len(engine.bodies) == 2


class DiesTwice(DyingThenHealthy):
    """The first continuation dies after one more token; the second completes."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.bodies.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        turn = len(self.bodies)
        await response.write(chunk(f"c{turn}", turn, {"role": "assistant", "content": ""}))
        for piece in {1: BEFORE, 2: [" c1"], 3: AFTER}[turn]:
            await response.write(chunk(f"c{turn}", turn, {"content": piece}))
        if turn < 3:
            request.transport.abort()
            return response
        await response.write(chunk("c3", 3, {}, "stop") + b"data: [DONE]\n\n")
        return response


async def test_a_second_break_goes_on_from_all_the_text_so_far(tmp_path) -> None:
    engine = DiesTwice()
    body = {"model": MODEL, "stream": True, "max_tokens": 10,
            "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    async with (
        scripted_backend(engine) as one, scripted_backend(engine) as two,
        scripted_backend(engine) as three,
    ):  # fmt: skip
        backends = [(one, "H100"), (two, "H100"), (three, "H100")]
        async with running_router(router_toml(backends), tmp_path) as (url, router):
            async with aiohttp.ClientSession(timeout=BOUNDED) as s:
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    raw = await r.read()
            assert counted(router, "engine_broke", "continued") == 2
            prefilled = counter(router, "gpuroute_stream_continuation_prefill_tokens")
    # each continuation prefills the prompt and the text before its break, counted once
    assert prefilled == (prompt_tokens(body) + len(BEFORE)) + (prompt_tokens(body) + 4)
    chunks = events(raw)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "".join([*BEFORE, " c1", *AFTER]) and {c["id"] for c in chunks} == {"c1"}
    third = engine.bodies[2]
    assert third["messages"][-1] == {"role": "assistant", "content": "".join([*BEFORE, " c1"])}
    assert third["max_tokens"] == 10 - len(BEFORE) - 1


class DiesAfterItsFinish(DyingThenHealthy):
    """Its finish is sent, then it dies before [DONE]: only the end of the stream is lost."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(json.loads(await request.read()))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in BEFORE:
            await response.write(chunk("cmpl-a", 111, {"content": piece}))
        await response.write(chunk("cmpl-a", 111, {}, "stop"))
        request.transport.abort()
        return response


async def test_a_stream_whose_finish_came_ends_with_done_not_a_continuation(tmp_path) -> None:
    engine = DiesAfterItsFinish()
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    raw, router = await through_two(engine, body, tmp_path)
    assert counted(router, "finished", "ended") == 1 and len(engine.bodies) == 1
    assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
    finishes = [c["choices"][0]["finish_reason"] for c in events(raw) if c["choices"]]
    assert [f for f in finishes if f] == ["stop"]  # its own finish, once


async def test_a_stop_string_across_the_seam_ends_the_answer_where_one_engine_would_have(
    tmp_path,
) -> None:
    """ " a3" ends the first engine's text, " b1" begins the continuation's: "3 b" spans the
    break, which no engine sees. The answer ends there, `stop`, the rest never relayed."""
    engine = DyingThenHealthy()
    usage = {"include_usage": True}
    body = {"model": MODEL, "stream": True, "stop": ["3 b"], "stream_options": usage,
            "messages": [{"role": "user", "content": "count for me"}]}  # fmt: skip
    raw, _router = await through_two(engine, body, tmp_path)
    chunks = events(raw)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "".join(BEFORE)  # its "3" was relayed before the break; " b" never is
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert raw.endswith(b"data: [DONE]\n\n") and b" b1" not in raw and b" b2" not in raw
    assert b'"error"' not in raw
    # no usage chunk: this engine sent no prompt ids, so no count the router could vouch for
    # (operations.md, "Stop strings across the break")
    assert b'"usage"' not in raw


async def test_each_continuation_is_a_span_and_its_engines_parent(tmp_path) -> None:
    engine = DyingThenHealthy()
    memory = InMemorySpanExporter()
    usage = {"include_usage": True}
    body = {"model": MODEL, "stream": True, "max_tokens": 5, "stream_options": usage,
            "messages": [{"role": "user", "content": "count for me"}]}  # fmt: skip
    async with scripted_backend(engine) as one, scripted_backend(engine) as two:
        config = router_toml([(one, "H100"), (two, "H100")],
                             tracing='otlp_endpoint = "http://127.0.0.1:9/v1/traces"')  # fmt: skip
        async with router_server(config, tmp_path) as server:
            with spans_to(server, memory):
                async with aiohttp.ClientSession(timeout=BOUNDED) as s:
                    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                    async with s.post(url, json=body) as r:
                        raw = await r.read()
    assert_one_answer(raw, engine, max_tokens=5)
    spans = {s.name: s for s in memory.get_finished_spans()}
    went_on, first = spans["gpuroute.continuation"], spans["gpuroute.attempt"]
    assert went_on.parent.span_id == first.context.span_id  # under the attempt that broke
    attributes = dict(went_on.attributes)
    assert attributes["gpuroute.tokens_before"] == len(BEFORE)
    assert attributes["gpuroute.outcome"] == "complete" and attributes["gpuroute.continuation"] == 1
    assert attributes["gpuroute.backend"] != first.attributes["gpuroute.backend"]
    parent = engine.headers[1]["traceparent"].split("-")[2]  # the continuation's engine
    assert parent == format(went_on.context.span_id, "016x")


@pytest.mark.parametrize("usage", [True, False])
async def test_an_engines_error_event_is_continued_not_relayed(tmp_path, usage) -> None:
    """vLLM ends a stream whose engine core failed with an error event, then [DONE]: the
    stream goes on elsewhere as if its connection had died; the error never reaches the
    client (asking for usage or not, which decides whether the router strips it)."""
    engine = DyingThenHealthy(error_event=True)
    body = {"model": MODEL, "stream": True, "max_tokens": 5,
            "messages": [{"role": "user", "content": "count for me"}]}  # fmt: skip
    if usage:
        body["stream_options"] = {"include_usage": True}
    raw, router = await through_two(engine, body, tmp_path)
    assert b'"error"' not in raw and counted(router, "engine_broke", "continued") == 1
    if usage:
        assert_one_answer(raw, engine, max_tokens=5)
    else:
        assert chat_text(raw) == "".join(BEFORE + AFTER) and b'"usage"' not in raw
