"""The engine's usage is read from the whole answer (issue 42 finding 1): whatever fields
come before or after `usage`, however large, however the bytes are cut into chunks."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuroute.relay.body import ResponseTally
from gpuroute.relay.usage_reader import (
    EVENT_HOLD,
    WHOLE_HOLD,
    UsageReader,
    names_usage,
    token_counts,
)

BODY_LIMIT = 8 * 1024 * 1024  # gpuroute.config's default max_body_bytes
COUNT = st.integers(0, 10**7)
# strings an answer's text or a prompt may hold: what a regex would have taken for usage
TRICKY = st.sampled_from(['"usage": {"prompt_tokens": 1}', '"completion_tokens": 0',
                          "data: {\"usage\":{}}\n\n", "\n\n", "usage", "é",
                          '"usage":null', "\r\n\r"])  # fmt: skip
# how an engine writes a null usage in every chunk (SGLang: compact; others spaced)
NULLS = st.sampled_from([b'"usage":null', b'"usage": null', b'"usage" :\tnull', b""])


def fed(chunks: list[bytes]) -> UsageReader:
    reader = UsageReader()
    for chunk in chunks:
        reader.feed(chunk)
    return reader


def cut(body: bytes, at: list[int]) -> list[bytes]:
    points = sorted({min(a, len(body)) for a in at} | {0, len(body)})
    return [body[a:b] for a, b in itertools.pairwise(points)]


@st.composite
def usages(draw: st.DrawFn) -> dict:
    """A usage object in one of the shapes engines send."""
    prompt, output = draw(COUNT), draw(COUNT)
    shape = draw(st.sampled_from(["openai", "responses", "messages", "pooling", "rerank"]))
    if shape == "openai":
        return {"prompt_tokens": prompt, "total_tokens": prompt + output,
                "completion_tokens": output, "prompt_tokens_details": None}  # fmt: skip
    if shape == "responses":
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 3},
                "output_tokens": output, "total_tokens": prompt + output}  # fmt: skip
    if shape == "messages":
        return {"input_tokens": prompt, "output_tokens": output,
                "cache_read_input_tokens": draw(st.none() | COUNT)}  # fmt: skip
    if shape == "pooling":
        return {"prompt_tokens": prompt, "total_tokens": prompt}
    return {"total_tokens": prompt}


@st.composite
def others(draw: st.DrawFn) -> dict:
    """Fields around usage: vLLM's extras, sized up to the body limit, and look-alikes."""
    size = draw(st.one_of(st.integers(0, 5000), st.integers(0, BODY_LIMIT)))
    return {
        "id": "chatcmpl-1",
        "choices": [{"message": {"content": draw(TRICKY)}, "usage": {"prompt_tokens": 1}}],
        "prompt_logprobs": [None, {"5": {"logprob": -1.5, "decoded_token": draw(TRICKY)}}],
        "prompt_token_ids": list(range(draw(st.integers(0, 3000)))),
        "prompt_text": draw(TRICKY) + "x" * size,
        "kv_transfer_params": None,
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(usage=usages(), rest=others(), data=st.data())
def test_a_whole_answer_gives_its_usage_wherever_it_stands(usage, rest, data) -> None:
    fields = [("usage", usage), *rest.items()]
    order = data.draw(st.permutations(fields))
    body = orjson.dumps(dict(order))
    at = data.draw(st.lists(st.integers(0, len(body)), max_size=40))
    reader = fed(cut(body, at))
    assert token_counts(reader.usage) == token_counts(usage)
    assert reader.usage == known(usage)


def known(usage: dict) -> dict:
    return {k: v for k, v in usage.items() if v is not None}


def sse(document: dict, name: str | None = None) -> bytes:
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + orjson.dumps(document) + b"\n\n"


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, dict]:
    """An SSE stream of any API with its usage events, and the usage they add up to."""
    api = draw(st.sampled_from(["chat", "responses", "messages"]))
    text = draw(TRICKY)
    null = draw(NULLS)  # b"": no usage field at all (vLLM's chunks)
    chunk = sse({"choices": [{"delta": {"content": text}}], "usage": None})
    chunk = chunk.replace(b'"usage":null', null) if null else chunk.replace(b',"usage":null', b"")
    filler = [chunk] * draw(st.integers(0, 30))
    first = draw(usages())
    last = draw(usages())
    beside = {"usage": None} if draw(st.booleans()) else {}  # a null usage beside the real one
    if api == "chat":  # continuous usage stats: every chunk; the last wins
        events = [
            *filler,
            sse({"choices": [], "usage": first}),
            sse({"choices": [], "usage": last}),
        ]
    elif api == "responses":
        big = "y" * draw(st.one_of(st.integers(0, 100), st.integers(EVENT_HOLD, 3 * EVENT_HOLD)))
        created = sse({"type": "response.created", "response": {"usage": None}})
        done = {"type": "response.completed", "response": {"output": big, "usage": last}}
        done |= beside
        events = [created, *filler, sse(done, "response.completed")]
        first = {}
    else:
        start = {"type": "message_start", "message": {"usage": first}} | beside
        start = sse(start, "message_start")
        delta = sse({"type": "message_delta", "usage": last}, "message_delta")
        events = [start, *filler, delta]
    if draw(st.booleans()):
        events = [e.replace(b"\n", b"\r\n") for e in events]
    body = b"".join(events) + b"data: [DONE]\n\n"
    return body, known(first) | known(last)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), data=st.data())
def test_a_stream_gives_its_latest_usage_however_it_is_cut(stream, data) -> None:
    body, usage = stream
    at = data.draw(st.lists(st.integers(0, len(body)), max_size=60))
    assert fed(cut(body, at)).usage == usage


def test_a_stream_cut_at_every_byte_gives_its_usage() -> None:
    """Each byte its own chunk: an event's end split over three chunks (CRLF framing)."""
    for newline in (b"\n", b"\r\n"):
        events = [sse({"choices": [], "usage": None}), sse({"usage": {"prompt_tokens": 3}})]
        body = b"".join(events).replace(b"\n", newline) + b"data: [DONE]" + newline * 2
        assert fed([body[i : i + 1] for i in range(len(body))]).usage == {"prompt_tokens": 3}


def test_only_a_usage_named_as_null_is_passed_unread() -> None:
    assert not names_usage(b'data: {"choices":[],"usage":null}\n\n')
    assert not names_usage(b'data: {"usage" : null, "x": "\\"usage\\": {}"}\n\n')
    assert not names_usage(b"data: [DONE]\n\n")
    assert names_usage(b'data: {"usage":null,"response":{"usage":{"input_tokens":1}}}\n\n')
    assert names_usage(b'data: {"usage":{"prompt_tokens":1}}\n\n')
    assert names_usage(b'data: {"usage":\ndata: null}\n\n')  # two data lines: read


def test_the_attack_body_usage_before_a_long_prompts_ids() -> None:
    """vLLM's order: usage, then prompt_logprobs and prompt_token_ids (ChatCompletionResponse):
    more than a kilobyte after usage hid it from the old 1,024-byte tail."""
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1800, "completion_tokens": 10},
                         "prompt_token_ids": list(range(1800))})  # fmt: skip
    tally = ResponseTally()
    for at in range(0, len(body), 512):
        tally.add(body[at : at + 512])
    assert tally.reported() == (1800, 10)
    assert tally.usage == {"prompt_tokens": 1800, "completion_tokens": 10}


def test_shapes() -> None:
    assert token_counts({"type": "duration", "seconds": 12}) == (None, None)
    assert token_counts({"total_tokens": 9}) == (9, None)  # rerank
    assert token_counts({"prompt_tokens": 4, "total_tokens": 4}) == (4, None)  # embeddings
    cached = {"input_tokens": 3, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 7}
    assert token_counts(cached | {"output_tokens": 2}) == (15, 2)
    assert token_counts({"prompt_tokens": True, "completion_tokens": -1}) == (None, None)
    audio = fed([b'{"text": "hi", "usage": {"type": "duration", "seconds": 3}}'])
    assert audio.usage == {"type": "duration", "seconds": 3}


def test_unreadable_answers_give_what_was_read() -> None:
    assert fed([b'{"usage": {"prompt_tokens": 2}}', b" trailing"]).usage == {"prompt_tokens": 2}
    assert fed([b"<html>not json</html>"]).usage is None
    assert fed([b'data: {"usage": {"prompt_tokens": 2\n\n', b"data: [DONE]\n\n"]).usage is None
    assert fed([b"[1, 2]"]).usage is None


def test_a_long_answer_is_parsed_as_it_comes_and_a_short_one_when_asked() -> None:
    """Up to WHOLE_HOLD bytes an answer is kept and parsed when its usage is asked for
    (asked again after more bytes: read again); past it, parsed chunk by chunk, nothing kept."""
    reader = fed([b'{"usage": {"prompt_tokens": 2}', b', "x": 1'])
    assert reader.usage == {"prompt_tokens": 2}  # cut short: what parses of it
    reader.feed(b', "usage": {"prompt_tokens": 5}}')
    assert reader.usage == {"prompt_tokens": 5}
    body = orjson.dumps({"usage": {"prompt_tokens": 7}, "pad": "x" * WHOLE_HOLD})
    chunks = cut(body, list(range(0, len(body), 65536)))
    reader = fed(chunks[:3])
    assert reader._kept is not None and reader.usage == {"prompt_tokens": 7}
    reader = fed(chunks)
    assert reader._kept is None and reader.usage == {"prompt_tokens": 7}


def test_a_long_string_parses_in_batches_and_a_cut_answer_gives_what_came() -> None:
    """Past the hold, bytes reach the parser in batches (a long string in 4 KB sends cost
    its length squared); usage asked for mid-batch is read from what came."""
    usage = {"input_tokens": 5, "output_tokens": 9}
    long = "y" * (EVENT_HOLD + 50_000)  # its usage comes after the first batch
    event = sse({"response": {"output": long, "usage": usage, "more": long}})
    whole = orjson.dumps({"pad": long, "usage": usage, "more": long})
    for body in (event, whole):
        at = body.index(b'"usage"') + 100  # cut short, its usage just past the hold
        assert fed(cut(body[:at], list(range(0, at, 4096)))).usage == usage
        assert fed(cut(body, list(range(0, len(body), 4096)))).usage == usage


def test_a_crlf_event_cut_before_its_last_byte_loses_nothing() -> None:
    """Found by the property above: a chunk holding no separator but a `\\r` was taken as
    ending one two bytes in (a missing CRLF separator read as found at -1 + 3)."""
    first = b'data: {"choices":[],"usage":{"total_tokens":0}}\r\n\r\n'
    second = b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5}}\r\n\r\n'
    body = first + second + b"data: [DONE]\r\n\r\n"
    at = len(first) + len(second) - 3  # the second event's `\r` ends a chunk
    usage = fed(cut(body, [len(first), at])).usage
    assert usage == {"total_tokens": 0, "prompt_tokens": 2, "completion_tokens": 5}
