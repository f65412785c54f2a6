"""The verdict on a stream whose upstream broke (gpuroute/continuation_verdict.py), which
both tiers apply: its finish or its spent cap first, then whether it may go on, and why not."""

from __future__ import annotations

import json

import pytest

from gpuroute.continuation import CHAT, ContinuationConfig
from gpuroute.continuation_verdict import CONTINUE, END, FINISH, judge


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
