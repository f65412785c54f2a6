"""Header hygiene and response bookkeeping of the relay."""

from __future__ import annotations

from gpuroute.relay import REQUEST_DROP, RESPONSE_DROP, ResponseTally, forward_headers


def test_hop_by_hop_and_connection_named_headers_are_stripped() -> None:
    headers = [
        ("Host", "router:8080"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("X-Secret-Hop", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "12"),
        ("TE", "trailers"),
        ("Authorization", "Bearer k"),
        ("x-session-id", "abc"),
    ]
    assert forward_headers(headers, REQUEST_DROP) == {
        "Authorization": "Bearer k",
        "x-session-id": "abc",
    }
    upstream = [("Content-Type", "text/event-stream"), ("Server", "uvicorn"), ("Upgrade", "h2c")]
    assert forward_headers(upstream, RESPONSE_DROP) == {"Content-Type": "text/event-stream"}


def test_tally_reads_usage_or_counts_token_events() -> None:
    with_usage = ResponseTally()
    for chunk in (
        b'data: {"a":1}\n\n',
        b'data: {"usage":{"completion_tokens": 17}}\n\n',
        b"data: [DONE]\n\n",
    ):
        with_usage.add(chunk)
    assert with_usage.output_tokens(streamed=True) == 17
    events = ResponseTally()
    for _ in range(10):  # role, 7 content chunks, finish, [DONE]
        events.add(b'data: {"x": 1}\n\n')
    assert events.output_tokens(streamed=True) == 7 and events.bytes == 160
    body = ResponseTally()
    body.add(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5}}')
    assert body.output_tokens(streamed=False) == 5
