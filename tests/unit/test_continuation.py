"""What a broken stream's continuation is made of (gpuroute/continuation.py): the reasons a
request cannot be continued, the text and tokens it had, the request that continues it,
and the splice that makes the new stream read as the rest of the first."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.continuation import (
    CHAT,
    COMPLETIONS,
    Broken,
    Splice,
    budget_spent,
    continuation_body,
    finish_events,
    read_broken,
    static_reason,
)


def event(delta: dict | None = None, *, text: str | None = None, finish=None, **top) -> bytes:
    choice = {"index": 0, "finish_reason": finish}
    choice.update({"text": text} if text is not None else {"delta": delta or {}})
    body = {"id": "a", "created": 1, "model": "m", "choices": [choice], **top}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}


@pytest.mark.parametrize(
    ("route", "body", "reason"),
    [
        (CHAT, CHAT_BODY, None),
        (CHAT, {**CHAT_BODY, "n": 3}, "n"),
        (CHAT, {**CHAT_BODY, "top_logprobs": 2}, "logprobs"),
        (CHAT, {**CHAT_BODY, "response_format": {"type": "json_object"}}, "guided_decoding"),
        (CHAT, {**CHAT_BODY, "seed": 0}, "seed"),
        (COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}, "prompt_not_text"),
        (COMPLETIONS, {"model": "m", "prompt": "p", "echo": True}, "logprobs"),
        ("/v1/embeddings", {"model": "m", "input": "x"}, "route"),
        (CHAT, None, "route"),
    ],
)
def test_what_cannot_be_continued_says_why(route, body, reason) -> None:
    assert static_reason(route, body) == reason


def test_the_text_tokens_and_head_of_what_the_client_received() -> None:
    chunks = [event({"role": "assistant", "content": ""}), event({"content": "Hel"}) + event(
        {"content": "lo"}), event({"content": ", world"})]  # fmt: skip
    broken = read_broken(b"".join(chunks), CHAT)
    assert broken.text == "Hello, world"
    assert broken.tokens == 3  # an event each (the text's estimate is no more)
    assert broken.head == {"id": "a", "created": 1, "model": "m"}
    assert not broken.finished and not broken.tool_calls
    packed = read_broken(event({"content": " tok" * 10}), CHAT)
    assert packed.tokens == 10  # one event holding ten tokens' text
    tool = read_broken(event({"tool_calls": [{"index": 0}]}), CHAT)
    assert tool.tool_calls
    done = read_broken(event(text="x") + event(text="", finish="stop"), COMPLETIONS)
    assert done.finished and done.text == "x"


def test_the_chat_continuation_continues_the_assistants_turn() -> None:
    body = {**CHAT_BODY, "max_tokens": 10, "min_tokens": 4, "temperature": 0.3, "stop": ["."]}
    out = continuation_body(body, CHAT, Broken(text="So far", tokens=3))
    assert out["messages"][-1] == {"role": "assistant", "content": "So far"}
    assert out["messages"][:-1] == body["messages"]  # the client's body is not edited
    assert len(body["messages"]) == 1
    assert (out["continue_final_message"], out["add_generation_prompt"]) == (True, False)
    assert (out["max_tokens"], out["min_tokens"], out["temperature"], out["stop"]) == (
        7, 1, 0.3, ["."])  # fmt: skip
    assert out["stream_options"] == {"include_usage": True}
    already = {**CHAT_BODY, "continue_final_message": True, "add_generation_prompt": False,
               "messages": [{"role": "user", "content": "q"},
                            {"role": "assistant", "content": "Once"}]}  # fmt: skip
    again = continuation_body(already, CHAT, Broken(text=" upon", tokens=1))
    assert again["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    prose = continuation_body({"model": "m", "prompt": "P:"}, COMPLETIONS, Broken(text=" x"))
    assert prose["prompt"] == "P: x" and "max_tokens" not in prose


def test_a_spent_cap_finishes_with_length() -> None:
    broken = Broken(text="abc", tokens=5, head={"id": "a", "created": 1, "model": "m"})
    assert budget_spent({"max_tokens": 5}, broken)
    assert not budget_spent({"max_tokens": 6}, broken) and not budget_spent({}, broken)
    end = finish_events(broken, CHAT, "length").split(b"\n\n")
    last = json.loads(end[0].removeprefix(b"data: "))
    assert last["id"] == "a" and last["choices"][0] == {
        "index": 0, "finish_reason": "length", "delta": {}}  # fmt: skip
    assert end[1] == b"data: [DONE]"


def splice_all(splice: Splice, data: bytes, cuts: list[int]) -> bytes:
    out, start = b"", 0
    for cut in [*sorted(cuts), len(data)]:
        out += splice.feed(data[start:cut])
        start = cut
    return out + splice.flush()


NEW = (event({"role": "assistant", "content": ""}, id="b", created=9)
       + event({"content": " more"}, id="b", created=9)
       + event({}, finish="stop", id="b", created=9)
       + b'data: {"id":"b","choices":[],"usage":{"prompt_tokens":13,"completion_tokens":2,'
       b'"total_tokens":15}}\n\n' + b"data: [DONE]\n\n")  # fmt: skip


@given(st.lists(st.integers(min_value=0, max_value=len(NEW)), max_size=8))
def test_the_splice_reads_the_same_however_the_stream_is_cut(cuts) -> None:
    head = {"id": "a", "created": 1, "model": "m"}
    out = splice_all(Splice(Broken(text="x" * 12, tokens=3, head=head)), NEW, cuts)
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert all((c["id"], c["created"], c["model"]) == ("a", 1, "m") for c in chunks)
    assert [c["choices"][0]["delta"] for c in chunks if c["choices"]] == [{"content": " more"}, {}]
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_what_cannot_be_read_or_is_reasoning_is_marked() -> None:
    assert read_broken(b"event: message\ndata: {}\n\n", CHAT).unread  # not `data:` alone
    assert read_broken(b"data: {not json\n\n", CHAT).unread
    quiet = read_broken(b": keep-alive\n\n" + event({"content": "x"}), CHAT)
    assert not quiet.unread and quiet.text == "x"
    assert read_broken(event({"reasoning_content": "hmm"}), CHAT).reasoning
    assert static_reason(COMPLETIONS, {"model": "m", "prompt": "p", "logprobs": 0}) == "logprobs"
    assert static_reason(CHAT, {**CHAT_BODY, "logprobs": False}) is None


def test_a_turn_in_content_parts_goes_on_as_one_more_part() -> None:
    parts = [{"type": "text", "text": "Once"}]
    body = {**CHAT_BODY, "continue_final_message": True, "add_generation_prompt": False,
            "messages": [{"role": "assistant", "content": parts}]}  # fmt: skip
    out = continuation_body(body, CHAT, Broken(text=" upon", tokens=1))
    assert out["messages"][-1]["content"] == [*parts, {"type": "text", "text": " upon"}]
    assert body["messages"][-1]["content"] == parts


def test_a_stream_is_kept_only_while_it_is_short_enough() -> None:
    from gpuroute.relay import ResponseTally

    tally = ResponseTally(size_text=True)
    tally.kept, tally.keep_up_to = bytearray(), 10
    tally.add(b"12345")
    tally.add(b"67890")
    assert tally.kept == b"1234567890"
    tally.add(b"x")
    assert tally.kept is None  # past the limit: nothing more kept, it cannot be continued


def test_a_continuation_is_placed_with_the_text_in_its_prompt_the_admitted_request_unchanged():
    from gpuroute.router.core import Backend, BackendSet, Scheduler
    from gpuroute.router.core.lifetime import Event, Phase, RequestLifetime
    from gpuroute.router.core.placement import AttemptLoop
    from gpuroute.router.core.policies import build_policy
    from gpuroute.router.core.request import RequestInfo
    from gpuroute.router.core.retry import RetryBudget, RetrySettings

    scheduler = Scheduler(
        BackendSet([Backend("a", "H100", ("m",))]), build_policy("least_outstanding_work")
    )
    loop = AttemptLoop(scheduler, RetryBudget(RetrySettings()), None)
    admitted = RequestInfo("r", "m", 100, 50)
    life = RequestLifetime(admitted)
    for event in (Event.ADMIT, Event.PLACE, Event.FIRST_BYTE):
        life.move(event)
    loop.continued(life, 20)
    assert life.phase is Phase.ROUTING
    assert (life.info.prompt_tokens, life.info.max_tokens) == (120, 30)
    assert (admitted.prompt_tokens, admitted.max_tokens) == (100, 50)  # what was charged
