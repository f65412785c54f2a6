"""What a broken stream's continuation is made of (gpuroute/continuation/text.py): the reasons a
request cannot be continued, the text and tokens it had, the request that continues it,
and the splice that makes the new stream read as the rest of the first."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.continuation.splice import Splice
from gpuroute.continuation.text import (
    CHAT,
    COMPLETIONS,
    Broken,
    ask_token_ids,
    budget_spent,
    continuation_body,
    finish_events,
    read_broken,
    sent_as,
    static_reason,
)


def event(
    delta: dict | None = None, *, text: str | None = None, finish=None, ids=None, **top
) -> bytes:
    choice = {"index": 0, "finish_reason": finish} | ({"token_ids": ids} if ids else {})
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
        (COMPLETIONS, {"model": "m", "prompt": ["a batch", "of two"]}, "prompt_not_text"),
        (COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}, None),  # from the answer's ids
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
    from gpuroute.relay.body import ResponseTally

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


IDS_STREAM = (
    event({"role": "assistant", "content": ""}, prompt_token_ids=[5, 6, 7, 8])
    + event({"content": "H"}, ids=[72])
    + event({}, ids=[195])
    + event({"content": "\u00e9!"}, ids=[169, 33])
)


def test_streamed_token_ids_make_the_count_exact() -> None:
    """A token with no text of its own (half a character) is counted; two in one event are
    two: four tokens, where events with text (2) or the text's estimate would say less."""
    broken = read_broken(IDS_STREAM, CHAT)
    assert (broken.text, broken.tokens) == ("H\u00e9!", 4)
    assert broken.prompt_ids == [5, 6, 7, 8] and broken.token_ids == [72, 195, 169, 33]
    body = continuation_body({**CHAT_BODY, "max_completion_tokens": 10, "top_k": 3}, CHAT, broken)
    assert sent_as(CHAT, CHAT_BODY, broken) == COMPLETIONS  # chat takes no token-id prompt
    usage = {"include_usage": True}
    assert body == {"model": "m", "prompt": [5, 6, 7, 8, 72, 195, 169, 33], "max_tokens": 6,
                    "top_k": 3, "stream": True, "stream_options": usage}  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [{"tools": [{"type": "function", "function": {"name": "f"}}]},
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}],
)  # fmt: skip
def test_a_chat_with_tools_or_images_goes_on_from_its_text(extra) -> None:
    """Its ids may not say it all (an image's placeholders), or its answer needs the chat
    API (a tool call later on): the turn goes on as text."""
    body = {**CHAT_BODY, **extra}
    out = continuation_body(body, CHAT, read_broken(IDS_STREAM, CHAT))
    assert sent_as(CHAT, body, read_broken(IDS_STREAM, CHAT)) == CHAT
    assert out["messages"][-1] == {"role": "assistant", "content": "H\u00e9!"}


def test_a_completion_read_back_as_the_chat_it_continues() -> None:
    broken = Broken(tokens=2, head={"id": "a", "created": 1, "model": "m"}, prompt_ids=[1, 2])
    new = (b'data: {"id":"b","object":"text_completion","choices":[{"index":0,"text":"lo",'
           b'"token_ids":[1],"prompt_token_ids":[1,2,3],"finish_reason":null}]}\n\n'
           + event(text="", finish="length"))  # fmt: skip
    out = [json.loads(e[6:]) for e in Splice(broken, as_chat=True).feed(new).split(b"\n\n") if e]
    assert [c["object"] for c in out] == ["chat.completion.chunk"] * 2
    assert [c["choices"][0] for c in out] == [
        {"index": 0, "delta": {"content": "lo"}, "token_ids": [1], "finish_reason": None},
        {"index": 0, "delta": {}, "finish_reason": "length"},
    ]


def test_a_completion_goes_on_as_token_ids_when_every_token_came_with_its_id() -> None:
    first = event(text="ab", ids=[97, 98]).replace(
        b'"index": 0', b'"index": 0, "prompt_token_ids": [1, 2]'
    )
    broken = read_broken(first + event(text="c", ids=[99]), COMPLETIONS)
    body = continuation_body({"model": "m", "prompt": "xy", "max_tokens": 5}, COMPLETIONS, broken)
    assert (body["prompt"], body["max_tokens"]) == ([1, 2, 97, 98, 99], 2)


def test_text_without_its_ids_falls_back_to_the_texts_count() -> None:
    broken = read_broken(IDS_STREAM + event({"content": "zz"}), CHAT)
    assert broken.token_ids is None and broken.tokens == 3  # events with text
    completion = read_broken(event(text="ab", prompt_token_ids=[1]), COMPLETIONS)
    assert completion.token_ids is None  # the engine ignored return_token_ids
    body = continuation_body({"model": "m", "prompt": "xy"}, COMPLETIONS, completion)
    assert body["prompt"] == "xyab"


def test_the_splice_drops_the_continuations_prompt_ids_and_counts_the_clients_prompt() -> None:
    broken = Broken(text="x" * 12, tokens=3, head={"id": "a"}, prompt_ids=[1] * 9)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2}}\n\n'
    new = event({"role": "assistant", "content": ""}, prompt_token_ids=[1] * 12) + usage
    out = [json.loads(e[6:]) for e in Splice(broken).feed(new).split(b"\n\n") if e]
    assert all("prompt_token_ids" not in chunk for chunk in out)
    assert out[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}


def test_token_ids_are_asked_for_once_and_said_to_be_stripped_where_the_client_did_not() -> None:
    body = {"model": "m", "messages": []}
    assert ask_token_ids(body) and body["return_token_ids"] is True
    assert not ask_token_ids(body)  # the client asked: it gets them


def test_a_stop_string_across_the_seam_finishes_the_answer_there() -> None:
    """The text before the break ends in "\\n"; the continuation's first "\\n" completes the
    stop string "\\n\\n", which its engine cannot see: the answer ends there, `stop`, with
    usage for the whole answer, and nothing of the continuation after it is relayed."""
    broken = Broken(text="one\n", tokens=2, head={"id": "a"}, prompt_ids=[1] * 5)
    splice = Splice(broken, body={"stop": ["\n\n"], "messages": []})
    new = event({"content": "\nmore"}, ids=[10, 11]) + event({"content": " text"}, ids=[12])
    out = splice.feed(new) + splice.feed(event({}, finish="length")) + splice.flush()
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and splice.ended
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0] == {"index": 0, "delta": {"content": ""},
                                       "finish_reason": "stop", "stop_reason": "\n\n"}  # fmt: skip
    assert chunks[1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert len(chunks) == 2


def test_a_stream_whose_text_lags_its_ids_goes_on_from_its_text() -> None:
    """vLLM holds back what a stop string could begin: the ids the client has run past its
    text, so they are not trusted (the count is the text's, the prompt text)."""
    stream = event(text="ab", ids=[97, 98, 99]).replace(
        b'"index": 0', b'"index": 0, "prompt_token_ids": [1]'
    )
    broken = read_broken(stream, COMPLETIONS, ids=False)
    assert broken.token_ids is None and broken.prompt_ids == [1] and broken.tokens == 1
    body = continuation_body({"model": "m", "prompt": "x", "stop": ["cd"]}, COMPLETIONS, broken)
    assert body["prompt"] == "xab"


def test_a_chat_as_a_completion_keeps_its_cap_and_asks_no_logprobs() -> None:
    """`max_completion_tokens` null falls back to `max_tokens`; a chat's `logprobs: false`
    would read as `logprobs: 0` to the completions API, which returns them."""
    body = {**CHAT_BODY, "max_completion_tokens": None, "max_tokens": 50, "logprobs": False,
            "top_logprobs": 0}  # fmt: skip
    out = continuation_body(body, CHAT, read_broken(IDS_STREAM, CHAT))
    assert out["max_tokens"] == 46 and "logprobs" not in out and "top_logprobs" not in out


def test_a_finish_that_came_without_its_usage_gets_usage_from_the_ids() -> None:
    broken = read_broken(IDS_STREAM + event({}, finish="stop"), CHAT)
    events = [e for e in finish_events(broken, CHAT, None).split(b"\n\n") if e]
    usage = json.loads(events[0][6:])["usage"]
    assert usage == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert events[1] == b"data: [DONE]"
    text_only = read_broken(event({"content": "x"}, finish="stop"), CHAT)
    assert finish_events(text_only, CHAT, None) == b"data: [DONE]\n\n"  # no count to vouch for


def test_text_held_at_the_seam_is_released_when_the_engine_finishes() -> None:
    """ "the E" then "N" could be the stop string "END": held; the engine then finishes, so
    it goes out with the finish."""
    splice = Splice(Broken(text="the E", tokens=2, head={"id": "a"}), body={"stop": ["END"]})
    out = splice.feed(event({"content": "N"}) + event({}, finish="stop"))
    chunks = [json.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [c["choices"][0]["delta"] for c in chunks] == [{"content": ""}, {"content": "N"}]
