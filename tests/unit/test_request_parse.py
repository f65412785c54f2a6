"""Request parsing: any body gives a ParsedRequest or a RequestError, never a crash."""

from __future__ import annotations

import json
import math

import pytest
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.front.parse import ParsedRequest, RequestError, parse_request, session_key
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuroute.prompt import BLOCK_CHARS, estimate_tokens, prefix_blocks

PRIORITIES = ("high", "normal", "low")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("m"), json_values),
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries({"role": st.just("user"), "content": json_values}), max_size=3
            ),
            json_values,
        ),
        "prompt": json_values,
        "max_tokens": json_values,
        "stream": json_values,
        "user": json_values,
    },
)


def parse(raw: bytes, headers: dict | None = None, path: str = "/v1/chat/completions"):
    return parse_request(
        path, raw, headers or {}, 1, priorities=PRIORITIES, default_priority="normal"
    )


@settings(max_examples=300, deadline=None)
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/x"]))
def test_any_json_body_parses_or_is_a_4xx(body, path) -> None:
    try:
        parsed = parse(json.dumps(body).encode(), path=path)
    except RequestError as err:
        assert 400 <= err.status < 500 and err.message
        return
    assert isinstance(parsed, ParsedRequest)
    info = parsed.info
    assert info.prompt_tokens >= 1 and isinstance(info.model, str)
    cost = CostEstimator().seconds("H100", 1.0, info.prompt_tokens, 100)
    assert math.isfinite(cost) and cost > 0


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_request_error(raw) -> None:
    try:
        parse(raw)
    except RequestError as err:
        assert err.status == 400


def test_extracts_what_the_scheduler_needs() -> None:
    text = "a" * (2 * BLOCK_CHARS + 10)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "max_completion_tokens": 50,
        "user": "alice",
        "stream": True,
    }
    parsed = parse(
        json.dumps(body).encode(), {"x-gpuroute-priority": "HIGH", "x-gpuroute-deadline-ms": "1500"}
    )
    info = parsed.info
    assert info.prompt_tokens == estimate_tokens(text) == 2 * 512 + 3
    assert (
        info.max_tokens == 50
        and info.session_id == session_key("alice")
        and info.priority == "high"
    )
    assert parsed.stream and parsed.deadline_s == pytest.approx(1.5)
    assert len(info.prefix_blocks) == 2 and info.prefix_blocks == prefix_blocks(text)
    # chained: a different first block changes every later hash
    assert prefix_blocks("b" + text[1:])[1] != info.prefix_blocks[1]


def test_blocks_are_not_hashed_when_no_policy_reads_them() -> None:
    raw = json.dumps({"model": "m", "prompt": "a" * (3 * BLOCK_CHARS)}).encode()
    parsed = parse_request(
        "/v1/completions", raw, {}, 1, priorities=PRIORITIES, default_priority="normal",
        with_prefix_blocks=False,
    )  # fmt: skip
    assert parsed.info.prefix_blocks == () and parsed.info.prompt_tokens == 3 * 512
