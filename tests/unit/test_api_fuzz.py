"""Whatever a client sends to any API route, the parser answers a 4xx in that API's terms
or a summary the scheduler can use: never another exception (the property behind
scripts/fuzz.py, at a CI-sized budget)."""

from __future__ import annotations

import orjson
from gpuroute.router.api.table import APIS
from gpuroute.router.front.parse import RequestError, parse_request
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuroute.auth import AuthError, client_key

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip
KEYS = st.sampled_from([
    "model", "messages", "prompt", "input", "stream", "max_tokens", "query", "documents",
    "text_1", "text_2", "tokens", "instructions", "max_output_tokens", "system", "background",
    "tools", "top_n", "n",
])  # fmt: skip
BODIES = st.one_of(
    st.binary(max_size=120),
    st.dictionaries(KEYS, VALUES, max_size=6).map(lambda d: {"model": "m", **d}).map(orjson.dumps),
)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(sorted(APIS)), BODIES)
def test_every_api_parser_answers_4xx_or_a_summary(route: str, raw: bytes) -> None:
    kind = "multipart/form-data; boundary=b" if route.startswith("/v1/audio/") else None
    try:
        parsed = parse_request(route, raw, {}, "r", priorities=("normal",),
                               default_priority="normal", content_type=kind)  # fmt: skip
    except RequestError as exc:
        assert 400 <= exc.status < 500 and exc.message
        return
    info = parsed.info
    assert info.prompt_tokens >= 1 and (info.max_tokens is None or info.max_tokens >= 0)
    assert parsed.api is APIS[route]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=60)), st.one_of(st.none(), st.text(max_size=60)))
def test_a_key_is_read_from_either_header_or_refused(bearer: str | None, key: str | None) -> None:
    headers = {k: v for k, v in (("authorization", bearer), ("x-api-key", key)) if v is not None}
    try:
        found = client_key(headers)
    except AuthError as exc:
        assert exc.status in (400, 401)
        return
    assert found is None or (found and " " not in found)
