"""Header hygiene and response bookkeeping of the relay."""

from __future__ import annotations

from gpuroute.relay.body import RESPONSE_DROP, ResponseTally, forward_headers


def test_hop_by_hop_and_connection_named_headers_are_stripped() -> None:
    upstream = [
        ("Content-Type", "text/event-stream"),
        ("Server", "uvicorn"),
        ("Upgrade", "h2c"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("X-Secret-Hop", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "12"),
        ("x-request-id", "abc"),
    ]
    assert forward_headers(upstream, RESPONSE_DROP) == {
        "Content-Type": "text/event-stream",
        "x-request-id": "abc",
    }


def test_tally_reads_usage_or_counts_token_events() -> None:
    with_usage = ResponseTally()
    for chunk in (
        b'data: {"a":1}\n\n',
        b'data: {"usage":{"completion_tokens": 17}}\n\n',
        b"data: [DONE]\n\n",
    ):
        with_usage.add(chunk)
    assert with_usage.reported() == (None, 17)
    events = ResponseTally()
    for _ in range(10):  # role, 7 content chunks, finish, [DONE]
        events.add(b'data: {"x": 1}\n\n')
    assert events.estimated_output() == 7 and events.bytes == 160
    body = ResponseTally()
    body.add(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5}}')
    assert body.reported() == (3, 5)


def test_a_tally_built_to_read_no_usage_counts_all_else() -> None:
    """The global tier's: no reader at all (its regions' routers settle usage)."""
    tally = ResponseTally(read_usage=False)
    tally.add(b'data: {"usage":{"completion_tokens": 17}}\n\ndata: [DONE]\n\n')
    assert tally.reader is None and tally.usage is None and tally.reported() == (None, None)
    assert tally.events == 2 and tally.bytes == 57


def _text_event(text: bytes, finish: bytes = b"null") -> bytes:
    return (
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{"content":"' + text + b'"},"finish_reason":' + finish + b"}]}\n\n"
    )


def test_tally_sizes_the_streamed_text_however_many_tokens_an_event_carries() -> None:
    """The role event has no text; the first event with text shows the skeleton. After it,
    chunks of one event, of several coalesced, and of a 3-token event are all measured by
    their text alone."""
    tally = ResponseTally(size_text=True)
    tally.add(b'data: {"id":"c1","choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
    assert tally.skeleton is None and tally.content == 0
    tally.add(_text_event(b" tok"))
    assert tally.skeleton == len(_text_event(b""))
    assert tally.content == 4
    escaped = b' say \\"hi\\"'  # its JSON text, escapes and all: 11 bytes
    tally.add(_text_event(b" tok tok tok") + _text_event(escaped))
    assert tally.content == 4 + 12 + 11
    tally.add(b"data: [DONE]\n\n")  # smaller than a skeleton: no text, not negative text
    assert tally.content == 4 + 12 + 11


def test_a_stream_with_no_text_in_its_first_chunks_stays_unsized() -> None:
    tally = ResponseTally(size_text=True)
    for _ in range(5):  # tool calls only: nothing to size the events by
        tally.add(b'data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}\n\n')
    tally.add(_text_event(b" late"))  # past the looks: the regex is not run again
    assert tally.skeleton is None and tally.content == 0


def test_a_tally_nobody_times_does_not_size_text() -> None:
    """The global tier and non-streamed answers count bytes and events only."""
    tally = ResponseTally()
    tally.add(_text_event(b" tok"))
    tally.add(_text_event(b" tok tok"))
    assert tally.skeleton is None and tally.content == 0 and tally.events == 2
