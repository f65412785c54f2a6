"""The verdict on a stream whose upstream broke (gpuroute/continuation/verdict.py), which
both tiers apply: its finish or its spent cap first, then whether it may go on, and why not."""

from __future__ import annotations

import json

import pytest

from gpuroute.continuation.text import CHAT, ContinuationConfig
from gpuroute.continuation.verdict import CONTINUE, END, FINISH, judge


def event(delta: dict | None = None, *, finish=None) -> bytes:
    choice = {"index": 0, "finish_reason": finish, "delta": delta or {}}
    body = {"id": "a", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}
ON, OFF = ContinuationConfig(), ContinuationConfig(enabled=False)
SENT = event({"role": "assistant", "content": ""}) + event({"content": "Hel"})


@pytest.mark.parametrize(
    ("config", "body", "kept", "tries", "verdict"),
    [
        (ON, CHAT_BODY, SENT, 0, (CONTINUE, None)),
        (ON, CHAT_BODY, SENT + event(finish="stop"), 2, (FINISH, "finished")),  # before tries
        (ON, {**CHAT_BODY, "max_tokens": 1}, SENT, 0, (FINISH, "length")),
        (ON, {**CHAT_BODY, "n": 2}, SENT + event(finish="stop"), 0, (FINISH, "finished")),
        (ON, {**CHAT_BODY, "n": 2}, SENT, 0, (END, "n")),
        (OFF, CHAT_BODY, None, 0, (END, "disabled")),
        (ON, CHAT_BODY, None, 0, (END, "too_long")),
        (ON, CHAT_BODY, SENT[:-1], 0, (END, "torn_event")),
        (ON, CHAT_BODY, SENT, 2, (END, "attempts")),
        (ON, CHAT_BODY, SENT + b"data: {oops\n\n", 0, (END, "unreadable")),
        (ON, CHAT_BODY, SENT + event({"reasoning_content": "hm"}), 0, (END, "reasoning")),
        (ON, CHAT_BODY, SENT + event({"tool_calls": [{"index": 0}]}), 0, (END, "tool_calls")),
    ],
)
def test_the_verdict_on_a_broken_stream(config, body, kept, tries, verdict) -> None:
    """Its finish or its spent cap first, then whether it may go on, and why not."""
    got = judge(config, CHAT, body, None if kept is None else bytearray(kept), tries)
    assert (got.action, got.reason) == verdict
    if got.action == CONTINUE:
        assert got.broken is not None and got.broken.text == "Hel"


def test_a_cap_is_spent_only_when_the_tokens_surely_reached_it() -> None:
    """Without token ids (stop strings: the text lags them) the count is the events with
    text: 90 of them, five characters each, under a cap of 100 go on, though the text's
    estimate (113) says more. Ending it `length` would cut the answer short."""
    sent = b"".join(event({"content": "abcde"}) for _ in range(90))
    body = {**CHAT_BODY, "max_tokens": 100, "stop": ["zz"]}
    got = judge(ON, CHAT, body, bytearray(sent), 0)
    assert (got.action, got.broken.events, got.broken.tokens) == (CONTINUE, 90, 113)


def test_a_token_id_prompt_goes_on_only_from_the_answers_ids() -> None:
    from gpuroute.continuation.text import COMPLETIONS, continuation_body

    first = {"id": "a", "choices": [{"index": 0, "text": "ab", "prompt_token_ids": [5, 6],
                                     "token_ids": [97, 98], "finish_reason": None}]}  # fmt: skip
    body = {"model": "m", "prompt": [5, 6], "max_tokens": 9, "stream": True}
    with_ids = b"data: " + json.dumps(first).encode() + b"\n\n"
    got = judge(ON, COMPLETIONS, body, bytearray(with_ids), 0)
    assert got.action == CONTINUE
    assert continuation_body(body, COMPLETIONS, got.broken)["prompt"] == [5, 6, 97, 98]
    del first["choices"][0]["token_ids"]
    without = b"data: " + json.dumps(first).encode() + b"\n\n"
    got = judge(ON, COMPLETIONS, body, bytearray(without), 0)
    assert (got.action, got.reason) == (END, "prompt_not_text")
