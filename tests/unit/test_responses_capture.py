"""Reading the finished response from a relayed Responses answer: a stream's terminal event
however the chunks split it, a whole body in pieces, and the bound on what is kept."""

from __future__ import annotations

import json

import pytest
from gpuroute.router.responses.capture import CapturedAnswer, terminal_response


def response(status: str = "completed", text: str = "hi") -> dict:
    item = {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    return {"id": "resp_1", "object": "response", "status": status, "output": [item],
            "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}  # fmt: skip


def event(kind: str, named: bool = True, **fields) -> bytes:
    data = json.dumps(fields | {"type": kind}).encode()
    return (f"event: {kind}\n".encode() if named else b"") + b"data: " + data + b"\n\n"


def stream(done: dict, named: bool = True) -> bytes:
    created = dict(done, status="in_progress", output=[])
    return b"".join(
        [
            event("response.created", named, response=created),
            event("response.output_text.delta", named, delta=" tok", item_id="msg_1"),
            # a delta quoting a terminal event's name is text, not an event
            event("response.output_text.delta", named, delta='"type":"response.completed"'),
            event("response.completed", named, response=done),
        ]
    )


def captured(streamed: bool, limit: int = 1 << 20) -> tuple[CapturedAnswer, list[dict]]:
    found: list[dict] = []
    return CapturedAnswer(streamed, limit, found.append), found


@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_the_terminal_event_is_found_however_the_chunks_split_it(named: bool, size: int) -> None:
    body = stream(response(), named)
    tally, found = captured(streamed=True)
    for i in range(0, len(body), size):
        tally.add(body[i : i + size])
    assert found == [response()]
    assert tally.bytes == len(body)  # still the relay's tally


def test_crlf_framing_and_an_incomplete_response_are_read() -> None:
    body = stream(response("incomplete")).replace(b"\n", b"\r\n")
    tally, found = captured(streamed=True)
    for i in range(0, len(body), 5):
        tally.add(body[i : i + 5])
    assert [r["status"] for r in found] == ["incomplete"]


def test_a_failed_response_or_a_stream_without_the_event_is_not_kept() -> None:
    tally, found = captured(streamed=True)
    tally.add(event("response.failed", response=response("failed")))
    tally.add(event("response.completed", response=response("failed")))
    tally.add(event("error", message="x"))
    assert found == []
    assert terminal_response(b"event: response.completed\ndata: {not json") is None


def test_a_whole_body_in_pieces_is_read_once_complete() -> None:
    body = json.dumps(response(text="}" * 50)).encode()  # braces inside strings
    tally, found = captured(streamed=False)
    for i in range(0, len(body), 11):
        tally.add(body[i : i + 11])
    assert found == [response(text="}" * 50)]
    tally.add(b"")
    assert len(found) == 1


def test_an_error_body_is_not_a_response() -> None:
    tally, found = captured(streamed=False)
    tally.add(b'{"error": {"message": "bad", "type": "invalid_request_error"}}')
    assert found == []


def test_past_the_limit_nothing_more_is_kept() -> None:
    tally, found = captured(streamed=True, limit=256)
    tally.add(stream(response(text="x" * 1000))[:-2])  # the terminal event not yet ended
    tally.add(b"\n\n")
    assert found == [] and tally._kept == b""
    whole, found_whole = captured(streamed=False, limit=256)
    body = json.dumps(response(text="x" * 1000)).encode()
    whole.add(body[:300])
    whole.add(body[300:])
    assert found_whole == []
