"""Streams ask the engine for usage; the usage chunk is stripped where the client did not
ask for it (router/stream_usage.py)."""

from __future__ import annotations

import orjson
from gpuroute.router.stream_usage import UsageStrippingTally, ask_usage, without_usage
from gpuroute.router.token_usage import TenantLabels, reported_usage

CHAT = "/v1/chat/completions"
ROLE = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + TOKEN + TOKEN + USAGE + DONE


def test_a_stream_without_stream_options_asks_for_usage() -> None:
    raw = orjson.dumps({"model": "m", "stream": True, "messages": []})
    body, strip = ask_usage(CHAT, True, raw)
    assert strip and orjson.loads(body)["stream_options"] == {"include_usage": True}


def test_include_usage_false_is_overridden_and_stripped() -> None:
    raw = orjson.dumps({"stream": True, "stream_options": {"include_usage": False, "x": 1}})
    body, strip = ask_usage("/v1/completions", True, raw)
    assert strip and orjson.loads(body)["stream_options"] == {"include_usage": True, "x": 1}


def test_a_client_that_asked_gets_its_body_unchanged() -> None:
    raw = orjson.dumps({"stream": True, "stream_options": {"include_usage": True}})
    assert ask_usage(CHAT, True, raw) == (raw, False)


def test_no_rewrite_off_streams_or_other_routes() -> None:
    raw = b'{"stream":false}'
    assert ask_usage(CHAT, False, raw) == (raw, False)
    assert ask_usage("/v1/responses", True, raw) == (raw, False)
    assert ask_usage("/v1/embeddings", True, raw) == (raw, False)


def test_without_usage_drops_only_the_usage_only_event() -> None:
    assert without_usage(STREAM) == ROLE + TOKEN + TOKEN + DONE
    spaced = b'data: {"choices": [ ], "usage": {"completion_tokens": 2}}\n\n'
    assert without_usage(TOKEN + spaced + DONE) == TOKEN + DONE
    kept = b'data: {"choices":[{"delta":{}}],"usage":null}\n\n'
    assert without_usage(kept) == kept


def test_the_tally_counts_what_it_strips_however_chunks_split() -> None:
    for size in (1, 5, 17, 64, len(STREAM)):
        tally = UsageStrippingTally()
        sent = b""
        for i in range(0, len(STREAM), size):
            chunk = STREAM[i : i + size]
            tally.add(chunk)
            sent += tally.outgoing(chunk)
        sent += tally.flush()
        assert sent == ROLE + TOKEN + TOKEN + DONE, size
        assert tally.used_tokens(True, 0) == 9


def test_an_unframed_stream_is_never_held() -> None:
    tally = UsageStrippingTally()
    assert tally.outgoing(b"data: {") == b"data: {"


def test_tenants_beyond_the_limit_fold_into_other() -> None:
    labels = TenantLabels(2)
    assert [labels(t) for t in ("a", "b", "c", "a", "other", "d")] == [
        "a", "b", "other", "a", "other", "other"
    ]  # fmt: skip


def test_reported_usage_reads_the_tail() -> None:
    tally = UsageStrippingTally()
    tally.add(STREAM)
    assert reported_usage(tally) == (7, 2)
    tally = UsageStrippingTally()
    tally.add(ROLE + TOKEN + DONE)
    assert reported_usage(tally) is None
