"""Streams ask the engine for usage; the usage chunk is stripped where the client did not
ask for it (router/usage/tokens.py)."""

from __future__ import annotations

import orjson
from gpuroute.router.attempts.exchange import Exchange
from gpuroute.router.config.metrics import BoundedLabels
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.front.parse import ParsedRequest
from gpuroute.router.usage.tokens import ask_usage
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.relay.strip import StrippingTally, without_usage

CHAT = "/v1/chat/completions"
ROLE = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + TOKEN + TOKEN + USAGE + DONE


def exchange(raw: bytes, route: str = CHAT, stream: bool = True) -> Exchange:
    """An Exchange as the proxy builds it: the body parsed once, usage asked for on it."""
    body = orjson.loads(raw)
    strip = ask_usage(route, stream, body)
    life = RequestLifetime(RequestInfo("r", body.get("model", "m"), 1))
    parsed = ParsedRequest(life.info, stream, None, body=body)
    return Exchange(None, life, raw, route, 0.0, parsed, {}, None, 0, body=body, edited=strip,  # type: ignore[arg-type]
                    strip_usage=strip)  # fmt: skip


def test_a_stream_without_stream_options_asks_for_usage() -> None:
    sent = exchange(orjson.dumps({"model": "m", "stream": True, "messages": []}))
    assert sent.strip_usage
    assert orjson.loads(sent.body_for("m"))["stream_options"] == {"include_usage": True}


def test_include_usage_false_is_overridden_and_stripped() -> None:
    raw = orjson.dumps({"stream": True, "stream_options": {"include_usage": False, "x": 1}})
    sent = exchange(raw, "/v1/completions")
    assert sent.strip_usage
    assert orjson.loads(sent.body_for("m"))["stream_options"] == {"include_usage": True, "x": 1}


def test_a_client_that_asked_gets_its_body_unchanged() -> None:
    raw = orjson.dumps({"stream": True, "stream_options": {"include_usage": True}})
    sent = exchange(raw)
    assert not sent.strip_usage and sent.body_for("m") is raw


def test_no_rewrite_off_streams_or_other_routes() -> None:
    raw = b'{"stream":false}'
    for route, stream in ((CHAT, False), ("/v1/responses", True), ("/v1/embeddings", True)):
        sent = exchange(raw, route, stream)
        assert not sent.strip_usage and sent.body_for("m") is raw


def test_a_body_is_serialised_once_per_model_and_the_model_set() -> None:
    sent = exchange(orjson.dumps({"model": "alias", "stream": False}), stream=False)
    assert sent.body_for("alias") is sent.raw  # the client's own name: as it came
    first = sent.body_for("served")
    assert orjson.loads(first) == {"model": "served", "stream": False}
    assert sent.body_for("served") is first  # a retry sends the same bytes


def test_without_usage_drops_only_the_usage_only_event() -> None:
    assert without_usage(STREAM) == ROLE + TOKEN + TOKEN + DONE
    spaced = b'data: {"choices": [ ], "usage": {"completion_tokens": 2}}\n\n'
    assert without_usage(TOKEN + spaced + DONE) == TOKEN + DONE
    kept = b'data: {"choices":[{"delta":{}}],"usage":null}\n\n'
    assert without_usage(kept) == kept


def test_the_tally_counts_what_it_strips_however_chunks_split() -> None:
    for size in (1, 5, 17, 64, len(STREAM)):
        tally = StrippingTally()
        sent = b""
        for i in range(0, len(STREAM), size):
            chunk = STREAM[i : i + size]
            tally.add(chunk)
            sent += tally.outgoing(chunk)
        sent += tally.flush()
        assert sent == ROLE + TOKEN + TOKEN + DONE, size
        assert tally.used_tokens(True, 0) == 9


def test_an_unframed_stream_is_never_held() -> None:
    tally = StrippingTally()
    assert tally.outgoing(b"data: {") == b"data: {"


def test_tenants_beyond_the_limit_fold_into_other() -> None:
    labels = BoundedLabels(2)
    assert [labels(t) for t in ("a", "b", "c", "a", "other", "d")] == [
        "a", "b", "other", "a", "other", "other"
    ]  # fmt: skip


def test_reported_usage_reads_the_stream() -> None:
    tally = StrippingTally()
    tally.add(STREAM)
    assert tally.reported() == (7, 2)
    tally = StrippingTally()
    tally.add(ROLE + TOKEN + DONE)
    assert tally.reported() == (None, None)


IDS = (b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],'
       b'"prompt_token_ids":[1, 2,3]}\n\n'
       b'data: {"id":"x","choices":[{"index":0,"delta":{"content":" tok"},"token_ids":[9]}]}\n\n'
       b'data: {"id":"x","choices":[{"index":0,"text":"a","prompt_token_ids":null,'
       b'"token_ids":[]}]}\n\n')  # fmt: skip
IDS_STRIPPED = (b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant",'
                b'"content":""}}]}\n\n'
                b'data: {"id":"x","choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'
                b'data: {"id":"x","choices":[{"index":0,"text":"a"}]}\n\n')  # fmt: skip


@given(st.lists(st.integers(min_value=0, max_value=len(IDS + USAGE + DONE)), max_size=6))
def test_token_ids_asked_for_the_client_are_stripped_however_chunks_split(cuts) -> None:
    stream = IDS + USAGE + DONE
    for usage in (True, False):
        tally = StrippingTally(usage=usage, token_ids=True)
        tally.kept, tally.keep_up_to = bytearray(), 1 << 20
        sent, start = b"", 0
        for cut in [*sorted(cuts), len(stream)]:
            tally.add(stream[start:cut])
            sent += tally.outgoing(stream[start:cut])
            start = cut
        sent += tally.flush()
        assert sent == IDS_STRIPPED + (b"" if usage else USAGE) + DONE
        assert tally.kept == stream  # what a continuation reads keeps them


def test_a_long_first_event_is_held_whole_for_its_prompt_ids() -> None:
    """A 2,000-token prompt's ids (about 14 KB) arriving in 5,000-byte reads: stripped."""
    ids = b",".join(b"123456" for _ in range(2000))
    first = (b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant"}}],'
             b'"prompt_token_ids":[' + ids + b"]}\n\n")  # fmt: skip
    tally, sent = StrippingTally(usage=False, token_ids=True), b""
    for i in range(0, len(first), 5000):
        tally.add(first[i : i + 5000])
        sent += tally.outgoing(first[i : i + 5000])
    assert sent == b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'


def test_a_stream_framed_with_crlf_passes_as_it_comes() -> None:
    """Accepted: its events cannot be told apart here, so its token ids reach a client that
    did not ask for them (engines frame with blank lines; such a stream is not continued)."""
    tally = StrippingTally(usage=False, token_ids=True)
    crlf = b'data: {"id":"x","choices":[],"token_ids":[1]}\r\n\r\n'
    assert tally.outgoing(crlf) == crlf and tally.outgoing(b"data: more") == b"data: more"


ERROR = b'data: {"error": {"message": "engine died", "code": 500}}\n\n'


def test_an_engines_error_event_breaks_a_kept_stream_and_never_reaches_the_client() -> None:
    for usage in (True, False):
        tally = StrippingTally(usage=usage)
        tally.kept, tally.keep_up_to = bytearray(), 1 << 20
        stream, cut, sent = ROLE + TOKEN + ERROR + DONE, len(ROLE) + 5, b""
        for piece in (stream[:cut], stream[cut:]):  # the error comes with what precedes it
            tally.add(piece)
            sent += tally.outgoing(piece)
        assert sent == ROLE + TOKEN and tally.engine_error == ERROR + DONE
        assert tally.kept == ROLE + TOKEN  # what a continuation goes on from
        assert tally.outgoing(b"data: late\n\n") == b"" and tally.flush() == b""


def test_an_error_event_in_a_stream_that_is_not_kept_is_relayed() -> None:
    tally = StrippingTally(usage=False)
    assert tally.outgoing(TOKEN + ERROR) == TOKEN + ERROR and tally.engine_error is None
