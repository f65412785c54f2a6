"""A follow-up's expansion before it is parsed: the stored conversation prepended, the
engine told `store: false`, its cost and prefix blocks covering the whole conversation; and
the attacks on it: another tenant's id, malformed fields, the conversations API."""

from __future__ import annotations

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request
from gpuroute.router.config.responses import ResponsesConfig
from gpuroute.router.front.parse import RequestError, json_object, parse_request
from gpuroute.router.responses.capture import CapturedAnswer
from gpuroute.router.responses.state import TURN, ResponsesState
from gpuroute.router.responses.store import ResponsesStore
from gpuroute.router.shared.quotas import KeyPolicy

from gpuroute.openai_api import Rejection
from gpuroute.relay.body import ResponseTally

pytestmark = pytest.mark.asyncio
ACME, GLOBEX = KeyPolicy("acme"), KeyPolicy("globex")
FIRST = "a long first question " * 200  # 4,400 characters: two full prefix blocks


def state() -> ResponsesState:
    config = ResponsesConfig()
    return ResponsesState(config, ResponsesStore(config))


def answer(rid: str, text: str) -> dict:
    item = {"type": "message", "role": "assistant", "id": "msg_" + rid, "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    return {"id": rid, "object": "response", "status": "completed", "output": [item],
            "previous_response_id": None}  # fmt: skip


async def turn(s: ResponsesState, key: KeyPolicy, body: dict, reply: dict | None = None):
    """One request through `expand`, its answer (if any) through the turn's tally; returns
    the body sent on and the aiohttp request."""
    request = make_mocked_request("POST", "/v1/responses")
    sent = orjson.loads(orjson.dumps(body))  # the front's one parse: a body of its own
    await s.expand(request, key, sent)
    if reply is not None:
        tally = request[TURN].tally(streamed=False)
        tally.add(orjson.dumps(reply))
        await s.close()
    return sent, request


def parsed(body: dict):
    return parse_request(
        "/v1/responses", orjson.dumps(body), {}, 1, priorities=("normal",),
        default_priority="normal",
    )  # fmt: skip


async def test_a_follow_up_carries_the_whole_conversation_and_no_previous_id() -> None:
    s = state()
    first = {"model": "m", "input": FIRST, "instructions": "be brief"}
    sent, request = await turn(s, ACME, first, answer("resp_1", "first answer " * 100))
    assert sent == first | {"store": False}  # the engine stores nothing
    assert request[TURN].input == [{"type": "message", "role": "user", "content": FIRST}]

    follow = {"model": "m", "input": [{"role": "user", "content": "and then?"}],
              "previous_response_id": "resp_1", "instructions": "be brief"}  # fmt: skip
    sent, request = await turn(s, ACME, follow, answer("resp_2", "second answer"))
    assert "previous_response_id" not in sent and sent["store"] is False
    assert [i.get("content") for i in sent["input"][::2]] == [FIRST, "and then?"]
    assert sent["input"][1]["content"][0]["text"] == "first answer " * 100

    # priced and hashed as the whole conversation, its first prefix blocks the first turn's
    one, two = parsed(first).info, parsed(sent).info
    assert two.prompt_tokens >= one.prompt_tokens + 1300 // 4  # its answer's 1,300 chars
    assert len(one.prefix_blocks) == 2 and two.prefix_blocks[:2] == one.prefix_blocks

    stored = await s.find("acme", "resp_2")
    assert stored.response["previous_response_id"] == "resp_1"  # as the client sent it
    assert len(stored.conversation()) == 4  # both turns' inputs and outputs
    third, _ = await turn(s, ACME, {"model": "m", "input": "3", "previous_response_id": "resp_2"})
    assert len(third["input"]) == 5


async def test_another_tenants_id_is_answered_as_an_unknown_one() -> None:
    s = state()
    await turn(s, ACME, {"model": "m", "input": "secret"}, answer("resp_a", "acme's answer"))
    refusals = []
    for rid in ("resp_a", "resp_unknown"):
        with pytest.raises(Rejection) as refused:
            await turn(s, GLOBEX, {"model": "m", "input": "x", "previous_response_id": rid})
        r = refused.value
        refusals.append((r.status, r.code, r.param, r.message.replace(rid, "ID")))
    assert refusals[0] == refusals[1]
    assert refusals[0][:3] == (404, "response_not_found", "previous_response_id")
    with pytest.raises(Rejection):
        await s.find("globex", "resp_a")


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("conversation", "conv_1", "conversation"),
        ("store", "yes", "store"),
        ("previous_response_id", 7, "previous_response_id"),
        ("previous_response_id", "", "previous_response_id"),
    ],
)
async def test_malformed_or_unsupported_fields_get_400(field, value, param) -> None:
    with pytest.raises(Rejection) as refused:
        await turn(state(), ACME, {"model": "m", "input": "x", field: value})
    assert (refused.value.status, refused.value.param) == (400, param)


async def test_a_body_that_is_no_json_object_is_refused_before_any_expansion() -> None:
    for raw in (b"{not json", b"[1, 2]"):
        with pytest.raises(RequestError) as refused:
            json_object(raw)  # what the front parses a Responses body with, once
        assert refused.value.status == 400


async def test_store_false_keeps_nothing_and_reads_no_answer() -> None:
    s = state()
    _, request = await turn(s, ACME, {"model": "m", "input": "x", "store": False})
    tally = request[TURN].tally(streamed=True)
    assert type(tally) is ResponseTally
    _, request = await turn(s, ACME, {"model": "m", "input": "x"})
    assert isinstance(request[TURN].tally(streamed=True), CapturedAnswer)


async def test_a_follow_up_waits_for_its_previous_response_still_being_stored() -> None:
    s = state()
    _, request = await turn(s, ACME, {"model": "m", "input": "x"})
    request[TURN].tally(streamed=False).add(orjson.dumps(answer("resp_w", "y")))
    assert ("acme", "resp_w") in s.writing  # not yet in the store
    sent, _ = await turn(s, ACME, {"model": "m", "input": "z", "previous_response_id": "resp_w"})
    assert len(sent["input"]) == 3
