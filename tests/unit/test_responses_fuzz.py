"""Any JSON body on /v1/responses is expanded or refused with a 4xx, never an exception
(hypothesis over bodies built from the fields the expansion reads)."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp.test_utils import make_mocked_request
from gpuroute.router.config.responses import ResponsesConfig
from gpuroute.router.front.parse import RequestError, json_object
from gpuroute.router.responses.state import ResponsesState
from gpuroute.router.responses.store import ResponsesStore
from gpuroute.router.shared.quotas import KeyPolicy
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.openai_api import Rejection

ACME = KeyPolicy("acme")


def state() -> ResponsesState:
    config = ResponsesConfig()
    return ResponsesState(config, ResponsesStore(config))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(["input", "previous_response_id", "store", "conversation", "model"])


@given(st.dictionaries(FIELDS, JSON, max_size=5) | JSON)
def test_any_json_body_is_expanded_or_refused_with_a_4xx(body) -> None:
    async def expand() -> None:
        s = state()
        request = make_mocked_request("POST", "/v1/responses")
        try:
            sent = json_object(orjson.dumps(body))  # the front's one parse
        except RequestError as refused:
            assert refused.status == 400 and not isinstance(body, dict)
            return
        try:
            await s.expand(request, ACME, sent)
        except Rejection as refused:
            assert 400 <= refused.status < 500
            return
        assert sent["store"] is False and "previous_response_id" not in sent

    asyncio.run(expand())
