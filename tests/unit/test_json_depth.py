"""The depth check both tiers make on a JSON body before parsing it: the nesting of arrays
and objects, whatever brackets, quotes and escapes its strings hold (issue 42 finding 9)."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuroute.openai_api import MAX_JSON_DEPTH, json_too_deep


def depth(value: object) -> int:
    """Arrays and objects nested in one another, as parsed."""
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


# strings made of what could fool a scanner: brackets, quotes, backslashes, escapes
tricky = st.text(st.sampled_from('[]{}"\\/bfnrtu\n\t\x00é𝄞 ,:'), max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), tricky
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(tricky, inner, max_size=4)
    ),
    max_leaves=60,
)


@settings(max_examples=600)
@given(values, st.integers(0, 8), st.booleans())
def test_the_depth_is_the_parsed_values_whatever_its_strings_hold(
    value: object, limit: int, ascii_only: bool
) -> None:
    for raw in (json.dumps(value, ensure_ascii=ascii_only).encode(), orjson.dumps(value)):
        assert json_too_deep(raw, limit) == (depth(value) > limit), raw


def nested(levels: int, inside: str = "0") -> bytes:
    return ("[" * levels + inside + "]" * levels).encode()


def test_the_limit_is_under_what_orjson_writes_and_over_what_requests_use() -> None:
    assert 30 < MAX_JSON_DEPTH < 255
    assert not json_too_deep(nested(MAX_JSON_DEPTH))
    assert json_too_deep(nested(MAX_JSON_DEPTH + 1))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(orjson.loads(nested(300)))  # why there is a limit


def test_brackets_in_strings_and_many_shallow_ones_do_not_count() -> None:
    assert not json_too_deep(b'{"a":"' + b"[{" * 10_000 + b'"}')
    assert not json_too_deep(b'{"a":"\\\\"' + b',"b":[' + b"[]," * 10_000 + b"[]]}")
    assert not json_too_deep(b'["\\"' + b"[" * 500 + b'"]')  # an escaped quote stays in
    assert json_too_deep(b'["\\\\",' + nested(MAX_JSON_DEPTH) + b"]")  # its backslash, not
