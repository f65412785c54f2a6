"""The fake engine's Responses and Anthropic Messages APIs on loopback: answers in vLLM's
shapes, streams that end as vLLM's do, stored state that lives (and dies) with the engine,
and malformed bodies refused in the format vLLM uses for each. The official `openai` and
`anthropic` clients read every answer (streamed and not)."""

from __future__ import annotations

import asyncio

import pytest
from gpuroute.testbed.fake_engine.responses import STORE_ENV
from support.fake_engine_app import fake_engine_app, sse_events

pytestmark = pytest.mark.asyncio
MODEL = "llama-3.1-8b"
RESPONSE_EVENTS = [
    "response.created", "response.in_progress", "response.output_item.added",
    "response.content_part.added", "response.output_text.delta", "response.output_text.done",
    "response.content_part.done", "response.output_item.done", "response.completed",
]  # fmt: skip
MESSAGE_EVENTS = ["message_start", "content_block_start", "content_block_delta",
                  "content_block_stop", "message_delta", "message_stop"]  # fmt: skip


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setenv(STORE_ENV, "1")  # vLLM keeps responses only when told to


def collapsed(names: list[str | None]) -> list[str | None]:
    """Event names with runs of one name (the deltas) collapsed to one."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


async def test_a_response_has_vllms_fields_usage_and_status(store) -> None:
    async with fake_engine_app() as fake:
        body = {"model": MODEL, "input": "hello there", "max_output_tokens": 5}
        status, answer = await fake.post("/v1/responses", body)
        assert status == 200 and answer["object"] == "response"
        assert answer["id"].startswith("resp_") and answer["model"] == MODEL
        assert answer["status"] == "incomplete"  # cut by max_output_tokens, as vLLM says
        assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
        (item,) = answer["output"]
        assert item["type"] == "message" and item["role"] == "assistant"
        assert item["content"][0]["type"] == "output_text"
        assert item["content"][0]["text"] == " tok" * 5
        usage = answer["usage"]
        assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (3, 5, 8)
        status, answer = await fake.post("/v1/responses", {"input": "hi", "max_output_tokens": 900})
        assert status == 200 and answer["status"] == "completed"  # ended before its cap
        assert answer["incomplete_details"] is None and answer["usage"]["output_tokens"] == 128


async def test_items_and_instructions_count_in_the_prompt() -> None:
    async with fake_engine_app() as fake:
        items = [
            {"role": "user", "content": "four"},  # 1 token
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "eightchr"}]},  # 2
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "abcdefghijkl"}]},  # 3
        ]  # fmt: skip
        body = {"input": items, "instructions": "be brief", "max_output_tokens": 2}
        status, answer = await fake.post("/v1/responses", body)
        assert status == 200 and answer["instructions"] == "be brief"
        assert answer["usage"]["input_tokens"] == 1 + 2 + 3 + 2


async def test_a_stored_response_is_read_and_continued_by_id(store) -> None:
    async with fake_engine_app() as fake:
        _, first = await fake.post(
            "/v1/responses", {"input": "hello there", "max_output_tokens": 5}
        )
        status, again = await fake.get(f"/v1/responses/{first['id']}")
        assert status == 200 and again == first
        body = {"input": "more", "previous_response_id": first["id"], "max_output_tokens": 2}
        status, second = await fake.post("/v1/responses", body)
        assert status == 200 and second["previous_response_id"] == first["id"]
        assert second["usage"]["input_tokens"] == first["usage"]["total_tokens"] + 1
        status, error = await fake.post(f"/v1/responses/{first['id']}/cancel")
        assert (
            status == 400 and error["error"]["message"] == "Cannot cancel a synchronous response."
        )
        for method, path in [("get", "/v1/responses/resp_nope"),
                             ("post", "/v1/responses/resp_nope/cancel")]:  # fmt: skip
            status, error = await getattr(fake, method)(path)
            assert status == 404 and error["error"]["param"] == "response_id"
        body = {"input": "x", "previous_response_id": "resp_nope"}
        assert (await fake.post("/v1/responses", body))[0] == 404
        _, unkept = await fake.post("/v1/responses", {"input": "x", "store": False})
        assert (await fake.get(f"/v1/responses/{unkept['id']}"))[0] == 404


async def test_state_dies_with_the_engine_and_needs_vllms_variable(store, monkeypatch) -> None:
    async with fake_engine_app() as fake:
        _, first = await fake.post("/v1/responses", {"input": "hi", "max_output_tokens": 2})
    async with fake_engine_app() as restarted:  # the same engine, started again
        assert (await restarted.get(f"/v1/responses/{first['id']}"))[0] == 404
    monkeypatch.delenv(STORE_ENV)
    async with fake_engine_app() as fake:
        _, answer = await fake.post("/v1/responses", {"input": "hi", "max_output_tokens": 2})
        assert (await fake.get(f"/v1/responses/{answer['id']}"))[0] == 404  # store ignored
        status, error = await fake.post("/v1/responses", {"input": "hi", "background": True})
        assert status == 400 and error["error"]["param"] == "background"


async def test_a_response_streams_vllms_events_in_order(store) -> None:
    async with fake_engine_app() as fake:
        body = {"input": "hi", "max_output_tokens": 6, "stream": True}
        status, content_type, text = await fake.raw("/v1/responses", json=body)
        assert status == 200 and content_type == "text/event-stream"
        events = sse_events(text)
        names = [name for name, _ in events]
        assert collapsed(names) == RESPONSE_EVENTS
        assert all(name == data["type"] for name, data in events)
        assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
        deltas = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
        done = events[-1][1]["response"]
        assert deltas == " tok" * 6 == done["output"][0]["content"][0]["text"]
        assert done["usage"]["output_tokens"] == 6 and done["status"] == "incomplete"
        assert (await fake.get(f"/v1/responses/{done['id']}"))[1] == done


async def test_a_background_response_runs_and_can_be_cancelled(store) -> None:
    async with fake_engine_app(default_output_tokens=4000) as fake:
        status, queued = await fake.post("/v1/responses", {"input": "hi", "background": True})
        assert status == 200 and queued["status"] == "queued" and queued["output"] == []
        status, cancelled = await fake.post(f"/v1/responses/{queued['id']}/cancel")
        assert status == 200 and cancelled["status"] == "cancelled"
        assert (await fake.get(f"/v1/responses/{queued['id']}"))[1]["status"] == "cancelled"
        metrics = await fake.metrics()
        assert metrics["vllm:num_requests_running"] == 0  # aborted in the engine model
        body = {"input": "hi", "background": True, "max_output_tokens": 2}
        _, quick = await fake.post("/v1/responses", body)
        for _ in range(100):
            _, now = await fake.get(f"/v1/responses/{quick['id']}")
            if now["status"] != "queued":
                break
            await asyncio.sleep(0.05)
        assert now["status"] == "incomplete" and now["usage"]["output_tokens"] == 2


RESPONSE_ERRORS = {
    "no input": ({"model": MODEL}, 400, "input"),
    "input a number": ({"input": 5}, 400, "input"),
    "an item not an object": ({"input": ["hi"]}, 400, "input"),
    "content a number": ({"input": [{"role": "user", "content": 5}]}, 400, "input"),
    "max_output_tokens a string": ({"input": "x", "max_output_tokens": "9"}, 400,
                                   "max_output_tokens"),
    "max_output_tokens beyond the context": ({"input": "x", "max_output_tokens": 10**7}, 400,
                                             "max_output_tokens"),
    "stream not a boolean": ({"input": "x", "stream": "yes"}, 400, "stream"),
    "a prompt beyond the context": ({"input": "x" * 4 * 500_000}, 400, "input_tokens"),
    "unknown model": ({"model": "nope", "input": "x"}, 404, "model"),
    "body not JSON": (b"{not json", 400, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(RESPONSE_ERRORS))
async def test_malformed_responses_get_openai_errors(case) -> None:
    body, want, param = RESPONSE_ERRORS[case]
    async with fake_engine_app() as fake:
        status, answer = await fake.post("/v1/responses", body)
        assert status == want, answer
        assert set(answer["error"]) == {"message", "type", "param", "code"}
        assert answer["error"]["param"] == param


async def test_messages_answer_in_anthropics_shape() -> None:
    async with fake_engine_app() as fake:
        hi = [{"type": "text", "text": "hi"}]
        body = {"model": MODEL, "max_tokens": 4, "system": [{"type": "text", "text": "be nice"}],
                "messages": [{"role": "user", "content": hi}]}  # fmt: skip
        status, answer = await fake.post("/v1/messages", body)
        assert status == 200
        assert answer == {
            "id": answer["id"], "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": " tok" * 4}], "model": MODEL,
            "stop_reason": "max_tokens", "usage": {"input_tokens": 3, "output_tokens": 4},
        }  # fmt: skip
        assert answer["id"].startswith("chatcmpl-")  # vLLM keeps the chat completion's id
        body["max_tokens"] = 500
        assert (await fake.post("/v1/messages", body))[1]["stop_reason"] == "end_turn"
        status, counted = await fake.post("/v1/messages/count_tokens", body | {"max_tokens": None})
        assert status == 200
        assert counted == {"input_tokens": 3, "context_management": {"original_input_tokens": 3}}


async def test_a_message_streams_anthropics_events() -> None:
    async with fake_engine_app() as fake:
        body = {"model": MODEL, "max_tokens": 5, "stream": True,
                "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
        status, content_type, text = await fake.raw("/v1/messages", json=body)
        assert status == 200 and content_type == "text/event-stream"
        events = sse_events(text)
        assert collapsed([name for name, _ in events]) == MESSAGE_EVENTS
        assert all(name == data["type"] for name, data in events)
        start, delta = events[0][1]["message"], events[-2][1]
        assert start["usage"] == {"input_tokens": 2, "output_tokens": 0}
        assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
        assert delta["usage"] == {"input_tokens": 2, "output_tokens": 5}
        texts = [d["delta"]["text"] for n, d in events if n == "content_block_delta"]
        assert "".join(texts) == " tok" * 5


MESSAGE_OK = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
MESSAGE_ERRORS = {  # vLLM: its schema's refusals in OpenAI's format, its handler's in Anthropic's
    "no max_tokens": ({k: v for k, v in MESSAGE_OK.items() if k != "max_tokens"}, 400, "openai"),
    "no model": ({k: v for k, v in MESSAGE_OK.items() if k != "model"}, 400, "openai"),
    "messages not a list": (MESSAGE_OK | {"messages": "hi"}, 400, "openai"),
    "a message without a role": (MESSAGE_OK | {"messages": [{"content": "x"}]}, 400, "openai"),
    "body not JSON": (b"{not json", 400, "openai"),
    "unknown model": (MESSAGE_OK | {"model": "nope"}, 404, "anthropic"),
    "max_tokens beyond the context": (MESSAGE_OK | {"max_tokens": 10**7}, 400, "anthropic"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MESSAGE_ERRORS))
async def test_malformed_messages_get_vllms_error_formats(case) -> None:
    body, want, shape = MESSAGE_ERRORS[case]
    async with fake_engine_app() as fake:
        status, answer = await fake.post("/v1/messages", body)
        assert status == want, answer
        if shape == "anthropic":
            assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}
            kind = "not_found_error" if want == 404 else "invalid_request_error"
            assert answer["error"]["type"] == kind
        else:
            assert set(answer["error"]) == {"message", "type", "param", "code"}
        if case != "max_tokens beyond the context":
            counted = await fake.post("/v1/messages/count_tokens", body)
            assert counted[0] == (200 if case == "no max_tokens" else want)


async def test_the_official_clients_read_every_answer(store) -> None:
    import anthropic
    import openai

    async with fake_engine_app() as fake:
        client = openai.AsyncOpenAI(base_url=fake.url + "/v1", api_key="x", max_retries=0)
        first = await client.responses.create(model=MODEL, input="hi", max_output_tokens=3)
        assert first.output_text == " tok" * 3 and first.usage.output_tokens == 3
        second = await client.responses.create(
            model=MODEL, input="more", previous_response_id=first.id, max_output_tokens=2
        )
        assert second.usage.input_tokens == first.usage.total_tokens + 1
        stream = await client.responses.create(
            model=MODEL, input="hi", max_output_tokens=4, stream=True
        )
        kinds = [event.type async for event in stream]
        assert collapsed(kinds) == RESPONSE_EVENTS
        claude = anthropic.AsyncAnthropic(base_url=fake.url, api_key="x", max_retries=0)
        message = await claude.messages.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.content[0].text == " tok" * 3 and message.stop_reason == "max_tokens"
        async with claude.messages.stream(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        ) as streamed:
            final = await streamed.get_final_message()
        assert final.content[0].text == " tok" * 3 and final.usage.output_tokens == 3
        with pytest.raises(anthropic.NotFoundError):
            await claude.messages.create(model="nope", max_tokens=3, messages=[])


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_streamed_token_ids_spell_the_text_and_the_prompt_as_tokenize_does(route) -> None:
    """`return_token_ids` (what a continuation goes on from): the answer's ids decode to
    the streamed text, the prompt's are what /tokenize gives (a chat's: each message's
    text in turn, parts too), and a token-id prompt ending in the fake's own output goes
    on with what is left of its answer."""
    from gpuroute.testbed.fake_engine.tokenize import decode, message_ids

    chat = [{"role": "system", "content": "ab"},
            {"role": "user", "content": [{"type": "text", "text": "cd efgh"}]}]  # fmt: skip
    given = {"messages": chat} if route == "/v1/chat/completions" else {"prompt": "cd efgh"}
    body = {"model": MODEL, "stream": True, "return_token_ids": True} | given
    async with fake_engine_app() as fake:
        status, _, text = await fake.raw(route, json=body)
        chunks = [d for _, d in sse_events(text) if isinstance(d, dict)]
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        holder = chunks[0] if route == "/v1/chat/completions" else choices[0]
        ids = [t for c in choices for t in c.get("token_ids") or []]
        pieces = [c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices]
        assert status == 200 and len(ids) > 2 and decode(ids) == "".join(pieces)
        if route == "/v1/chat/completions":
            assert holder["prompt_token_ids"] == message_ids(chat)
        else:
            _, tokenized = await fake.post("/tokenize", {"model": MODEL, "prompt": "cd efgh"})
            assert holder["prompt_token_ids"] == tokenized["tokens"]
        onward = {"model": MODEL, "prompt": holder["prompt_token_ids"] + ids[:2]}
        _, answer = await fake.post("/v1/completions", onward)
    assert answer["usage"]["completion_tokens"] == len(ids) - 2  # what was left of it
