"""The request metrics, on an injected clock: a stream's first token is its first chunk with
text (not the role-only first event), inter-token latency is the stream's mean gap (its
end less its first token, over its output tokens less one), the backend is timed from
dispatch to the last byte, and model labels stay bounded."""

from __future__ import annotations

import pytest
from gpuroute.router.attempts.exchange import Answer, Exchange
from gpuroute.router.config.metrics import OTHER, BoundedLabels
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.observe.request_metrics import RequestMetrics

from gpuroute.relay.body import ResponseTally

CHAT = "/v1/chat/completions"
HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":'
ROLE = HEAD + b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
TOKEN = HEAD + b'[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
FINISH = HEAD + b'[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
USAGE = HEAD + b'[],"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":11}}\n\n'
DONE = b"data: [DONE]\n\n"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def setup(model: str = "m") -> tuple[RouterMetrics, RequestMetrics, Exchange, Clock]:
    metrics = RouterMetrics(BoundedLabels(10, lambda name: name == "m"))
    clock = Clock()
    life = RequestLifetime(RequestInfo(1, model, 7))
    exchange = Exchange(None, life, b"", CHAT, 0.0, {})  # type: ignore[arg-type]
    return metrics, RequestMetrics(metrics, clock), exchange, clock


def histogram(metrics: RouterMetrics, name: str, **labels: str) -> tuple[float, float]:
    """(sum, count) of one histogram's series."""
    sample = metrics.registry.get_sample_value
    return sample(name + "_sum", labels) or 0.0, sample(name + "_count", labels) or 0.0


def first_write(
    requests: RequestMetrics, exchange: Exchange, clock: Clock, tally: ResponseTally
) -> None:
    exchange.first_at = clock.now
    requests.first_byte(exchange, tally, tally is not WHOLE)


WHOLE = ResponseTally()  # a whole answer's (unsized)


def test_a_streams_first_token_is_its_first_text_not_the_role_event() -> None:
    metrics, requests, exchange, clock = setup()
    tally = ResponseTally(size_text=True)
    requests.time_text(exchange, tally)
    clock.now = 0.1
    tally.add(ROLE)  # the engine's first event: the role, no text
    first_write(requests, exchange, clock, tally)
    for clock.now in (0.5, 0.6, 0.7, 0.8):
        tally.add(TOKEN)
    tally.add(FINISH + USAGE + DONE)  # sent with the last token, as engines do
    exchange.dispatched = 0.05
    exchange.answer = Answer(200, True, tally, "b0")
    requests.relayed(exchange, "b0", complete=True)

    route = {"route": CHAT, "model": "m"}
    assert histogram(metrics, "gpuroute_time_to_first_byte_seconds", **route) == (0.1, 1)
    assert histogram(metrics, "gpuroute_time_to_first_token_seconds", **route) == (0.5, 1)
    itl_sum, itl_count = histogram(metrics, "gpuroute_inter_token_latency_seconds", model="m")
    assert itl_count == 1 and itl_sum == pytest.approx((0.8 - 0.5) / (4 - 1))  # usage: 4
    backend = histogram(metrics, "gpuroute_backend_request_duration_seconds", backend="b0")
    assert backend == (pytest.approx(0.75), 1)


def test_text_in_the_first_chunk_is_timed_as_it_reaches_the_client() -> None:
    metrics, requests, exchange, clock = setup()
    tally = ResponseTally(size_text=True)
    requests.time_text(exchange, tally)
    clock.now = 0.2
    tally.add(ROLE + TOKEN)  # role and first text read together, before the first write
    clock.now = 0.25
    first_write(requests, exchange, clock, tally)
    for clock.now in (0.3, 0.4, 0.55):
        tally.add(TOKEN)
    tally.add(FINISH + USAGE + DONE)
    exchange.answer = Answer(200, True, tally, "b0")
    requests.relayed(exchange, "b0", complete=True)
    first = histogram(metrics, "gpuroute_time_to_first_token_seconds", route=CHAT, model="m")
    assert first == (0.25, 1)
    itl = histogram(metrics, "gpuroute_inter_token_latency_seconds", model="m")
    assert itl == (pytest.approx(0.1), 1)  # (0.55 - 0.25) / (4 - 1)


def test_without_usage_a_streams_tokens_are_the_tallys_estimate() -> None:
    metrics, requests, exchange, clock = setup()
    tally = ResponseTally(size_text=True)
    requests.time_text(exchange, tally)
    tally.add(ROLE)
    first_write(requests, exchange, clock, tally)
    for clock.now in (0.1, 0.2, 0.3):
        tally.add(TOKEN)
    tally.add(FINISH)
    tally.add(DONE)
    exchange.answer = Answer(200, True, tally, "b0")
    requests.relayed(exchange, "b0", complete=True)
    assert exchange.answer.output_tokens() == 3  # one an event (and 4 bytes of text each)
    itl = histogram(metrics, "gpuroute_inter_token_latency_seconds", model="m")
    assert itl == (pytest.approx(0.1), 1)  # (0.3 - 0.1) / (3 - 1)


def test_a_whole_answers_first_token_is_its_first_byte_and_it_has_no_inter_token_latency():
    metrics, requests, exchange, clock = setup()
    clock.now = 0.3
    first_write(requests, exchange, clock, WHOLE)
    exchange.answer = Answer(200, False, WHOLE, "b1")
    requests.relayed(exchange, "b1", complete=True)
    route = {"route": CHAT, "model": "m"}
    assert histogram(metrics, "gpuroute_time_to_first_token_seconds", **route) == (0.3, 1)
    assert histogram(metrics, "gpuroute_inter_token_latency_seconds", model="m") == (0, 0)
    assert histogram(metrics, "gpuroute_backend_request_duration_seconds", backend="b1")[1] == 1


def test_a_stream_without_visible_text_counts_its_first_byte_and_a_broken_one_no_backend():
    metrics, requests, exchange, clock = setup()
    tally = ResponseTally(size_text=True)
    requests.time_text(exchange, tally)
    clock.now = 0.4
    tally.add(ROLE)
    first_write(requests, exchange, clock, tally)
    clock.now = 0.9
    exchange.answer = Answer(200, True, tally, "b0")
    requests.relayed(exchange, "b0", complete=False)  # broke (or its client left)
    first = histogram(metrics, "gpuroute_time_to_first_token_seconds", route=CHAT, model="m")
    assert first == (0.4, 1)
    assert histogram(metrics, "gpuroute_backend_request_duration_seconds", backend="b0") == (0, 0)
    assert histogram(metrics, "gpuroute_inter_token_latency_seconds", model="m") == (0, 0)


def test_unknown_models_fold_into_other() -> None:
    metrics, requests, exchange, clock = setup(model="made-up")
    clock.now = 0.1
    first_write(requests, exchange, clock, WHOLE)
    route = {"route": CHAT, "model": OTHER}
    assert histogram(metrics, "gpuroute_time_to_first_byte_seconds", **route) == (0.1, 1)


def test_model_labels_name_known_models_up_to_the_limit() -> None:
    known = {"a", "b", "c", OTHER}
    asked: list[str] = []

    def knows(model: str) -> bool:
        asked.append(model)
        return model in known

    label = BoundedLabels(2, knows)
    assert [label(m) for m in ("a", "x", "b", "c", "a", "")] == ["a", OTHER, "b", OTHER, "a", ""]
    assert label(OTHER) == OTHER  # a model named `other` is not told apart
    assert asked.count("a") == 1  # named once, then a set lookup
    later = BoundedLabels(5, knows)
    assert later("y") == OTHER
    known.add("y")  # a model that joined later is named from then on (within the limit)
    assert later("y") == "y"
