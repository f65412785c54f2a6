"""Each API is priced as its own kind of work (router/api/table.py): a rerank or a score is a
prefill of every (query, document) pair and nothing after it, an audio upload costs what its
duration says, a tokenizer lookup is free; exact costs from the cost model."""

from __future__ import annotations

import io
import random
import wave

import orjson
import pytest
from gpuroute.router.api.table import APIS
from gpuroute.router.core.cost import CostEstimator, GpuCostPrior
from gpuroute.router.front.parse import RequestError, parse_request

PRIOR = GpuCostPrior(prefill_s_per_token=2e-5, decode_s_per_token=4e-4)
PRIORITIES = ("high", "normal", "low")
HI = [{"role": "user", "content": "hi"}]


def parse(path: str, body: bytes, content_type: str | None = None):
    return parse_request(path, body, {}, "r1", priorities=PRIORITIES, default_priority="normal",
                         content_type=content_type)  # fmt: skip


def cost(info) -> float:
    """What the scheduler books for it on one backend (PickContext.cost_on's arithmetic)."""
    estimator = CostEstimator({"H100": PRIOR})
    output = estimator.expected_output(info.model, info.max_tokens, info.prompt_tokens)
    return estimator.seconds("H100", 1.0, info.prompt_tokens, output)


def test_a_rerank_of_100_documents_is_priced_as_their_prefill() -> None:
    rng = random.Random(7)
    docs = ["x" * rng.randrange(40, 4000) for _ in range(100)]
    body = {"model": "reranker", "query": "q" * 64, "documents": docs, "top_n": 5}
    parsed = parse("/v1/rerank", orjson.dumps(body))
    info = parsed.info
    # every pair prefills the query (64 chars: 16 tokens) and its document (4 chars a token)
    expected_tokens = sum(16 + -(-len(d) // 4) for d in docs)
    assert info.prompt_tokens == expected_tokens
    assert info.max_tokens == 0 and parsed.outputs == 0 and not parsed.stream
    assert cost(info) == pytest.approx(expected_tokens * 2e-5)  # no decode at all
    assert parsed.api is not None and parsed.api.work == "prefill" and parsed.api.charges


def test_score_pairs_one_text_against_each() -> None:
    one_to_many = {"model": "s", "text_1": "a" * 40, "text_2": ["b" * 8, "c" * 400]}
    assert parse("/score", orjson.dumps(one_to_many)).info.prompt_tokens == (10 + 2) + (10 + 100)
    pairs = {"model": "s", "text_1": ["a" * 4, "b" * 4], "text_2": ["c" * 4, "d" * 4]}
    assert parse("/v1/score", orjson.dumps(pairs)).info.prompt_tokens == 4
    with pytest.raises(RequestError) as bad:
        parse("/v1/score", orjson.dumps({**pairs, "text_2": ["c", "d", "e"]}))
    assert bad.value.status == 400 and bad.value.param == "text_2"


def wav(seconds: float, rate: int = 16_000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


def multipart(fields: dict[str, str], audio: bytes, boundary: str = "b0undary") -> bytes:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + audio
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


def test_an_audio_upload_is_priced_by_its_duration() -> None:
    body = multipart({"model": "whisper"}, wav(30.0))
    parsed = parse("/v1/audio/transcriptions", body, "multipart/form-data; boundary=b0undary")
    info = parsed.info
    # 30 s of audio: 50 encoder frames a second (1,500), a transcript of at most 4 a second
    assert (info.model, info.prompt_tokens, info.max_tokens) == ("whisper", 1500, 120)
    assert parsed.audio_s == pytest.approx(30.0)
    assert cost(info) == pytest.approx(1500 * 2e-5 + 120 * 4e-4)
    with pytest.raises(RequestError) as bad:
        parse("/v1/audio/translations", b"{}", "application/json")
    assert bad.value.status == 400


def test_tokenizer_lookups_are_free_and_never_held() -> None:
    for path, body in (
        ("/tokenize", {"model": "m", "prompt": "hello there"}),
        ("/detokenize", {"model": "m", "tokens": [1, 2, 3]}),
        ("/v1/messages/count_tokens", {"model": "m", "messages": HI}),
    ):  # fmt: skip
        parsed = parse(path, orjson.dumps(body))
        assert parsed.api is not None and not parsed.api.charges, path
        assert not parsed.info.holds and parsed.info.max_tokens == 0, path


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rerank", {"model": "m", "documents": ["a"]}, "query"),
        ("/v1/rerank", {"model": "m", "query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"model": "m", "query": "q", "documents": [3]}, "documents"),
        ("/pooling", {"model": "m"}, "input"),
        ("/classify", {"model": "m", "input": []}, "input"),
        ("/tokenize", {"model": "m"}, "prompt"),
        ("/detokenize", {"model": "m", "tokens": ["a"]}, "tokens"),
        ("/v1/responses", {"model": "m"}, "input"),
        ("/v1/responses", {"model": "m", "input": "x", "background": True}, "background"),
        ("/v1/responses", {"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ("/v1/messages", {"model": "m", "messages": HI}, "max_tokens"),
        ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "x"}]}, "messages"),
    ],
)  # fmt: skip
def test_malformed_bodies_name_the_field(path: str, body: dict, param: str) -> None:
    with pytest.raises(RequestError) as bad:
        parse(path, orjson.dumps(body))
    assert bad.value.status == 400 and bad.value.param == param


def test_every_api_route_is_in_the_table() -> None:
    from gpuroute.openai_api import API_ROUTES

    assert set(API_ROUTES) == set(APIS)


def test_the_anthropic_routes_are_messages_apis() -> None:
    from gpuroute.anthropic_errors import ANTHROPIC_ROUTES

    assert {p for p in APIS if p.startswith("/v1/messages")} == set(ANTHROPIC_ROUTES)


@pytest.mark.parametrize(
    ("answer", "used"),
    [
        # Responses API: usage at the end of the response object (input + output)
        (b'{"object":"response","usage":{"input_tokens":30,"input_tokens_details":'
         b'{"cached_tokens":0},"output_tokens":12,"output_tokens_details":'
         b'{"reasoning_tokens":0},"total_tokens":42}}', 42),
        # Anthropic's stream: message_start's input, then message_delta's cumulative output
        (b'event: message_start\ndata: {"message":{"usage":{"input_tokens":9,"output_tokens":1}}}'
         b'\n\nevent: message_delta\ndata: {"usage":{"output_tokens":15}}\n\n', 24),
        # rerank and embeddings: vLLM's UsageInfo, prompt only
        (b'{"usage":{"prompt_tokens":210,"total_tokens":210,"completion_tokens":0}}', 210),
        # Anthropic's cache reads and writes are prompt too (vLLM takes them out of input)
        (b'{"usage":{"input_tokens":5,"cache_read_input_tokens":64,'
         b'"cache_creation_input_tokens":16,"output_tokens":3}}', 88),
    ],
)  # fmt: skip
def test_quotas_settle_on_each_apis_own_usage(answer: bytes, used: int) -> None:
    from gpuroute.relay.body import ResponseTally

    tally = ResponseTally()
    tally.add(answer)
    assert tally.used_tokens(streamed=False, prompt_estimate=1) == used
