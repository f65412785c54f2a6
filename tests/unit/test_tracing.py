"""gpuroute/tracing.py: which request ids and trace contexts are kept, what replaces the
rest, and the middleware that decides a request's id (and its log lines' id)."""

from __future__ import annotations

import re

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.request_context import REQUEST_ID as LOG_REQUEST_ID
from gpuroute.tracing import (
    CLIENT_REQUEST_ID,
    ONWARD,
    REQUEST_ID,
    TRACER,
    Tracing,
    TracingConfig,
    client_request_id,
    engine_request_id,
    incoming,
    middleware,
    new_request_id,
    valid_traceparent,
    valid_tracestate,
)

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_safe_client_id_is_kept_beside_ours_anything_else_dropped() -> None:
    for ok in ("a", "req-1", "A.b_c:d-e", "x" * 128):
        assert client_request_id([ok]) == ok
    for bad in ("", "x" * 129, "a b", "a\r\nb", "ïd", "a/b", "a%0d"):
        assert client_request_id([bad]) is None
    assert client_request_id([]) is None and client_request_id(["a", "b"]) is None
    ids = {new_request_id() for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)


@given(st.text(max_size=200))
def test_whatever_comes_the_kept_id_is_safe_to_log(text: str) -> None:
    kept = client_request_id([text])
    assert kept is None or re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", kept)


def test_an_engine_id_is_unique_per_attempt() -> None:
    ids = {engine_request_id("req-1", 0) for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"req-1-0-[0-9a-f]{8}", i) for i in ids)


def test_only_a_well_formed_version_00_traceparent_is_valid() -> None:
    assert valid_traceparent(GOOD) == GOOD
    for bad in (
        None, "", GOOD.upper(), GOOD + "-x", "01" + GOOD[2:], "ff" + GOOD[2:],
        GOOD.replace("4bf92f3577b34da6a3ce929d0e0e4736", "0" * 32),
        GOOD.replace("00f067aa0ba902b7", "0" * 16), " " + GOOD, GOOD[:-1],
    ):  # fmt: skip
        assert valid_traceparent(bad) is None, bad


def test_tracestate_bounds() -> None:
    assert valid_tracestate("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7") == (
        "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    )
    for bad in (None, "", "x" * 513, "novalue", "a=b\r\nc=d", ",".join(["a=b"] * 33)):
        assert valid_tracestate(bad) is None, bad


def test_incoming_adopts_only_a_single_valid_context() -> None:
    def headers(**values: list[str]):
        return lambda name: values.get(name, [])

    assert incoming(headers()) == ({}, False)
    assert incoming(headers(traceparent=[GOOD], tracestate=["a=b"])) == (
        {"traceparent": GOOD, "tracestate": "a=b"},
        True,
    )
    for bad in ([GOOD, GOOD], ["junk"]):
        came, adopted = incoming(headers(traceparent=bad, tracestate=["a=b"]))
        assert not adopted and set(came) == {"traceparent"}
        assert valid_traceparent(came["traceparent"]) and came["traceparent"] != GOOD


@pytest.mark.asyncio
async def test_the_middleware_names_the_request_and_its_log_lines_without_spans() -> None:
    seen = {}

    async def handler(request: web.Request) -> web.Response:
        seen.update(
            rid=request[REQUEST_ID], log=LOG_REQUEST_ID.get(), tracer=TRACER.get(),
            onward=request[ONWARD], client=request[CLIENT_REQUEST_ID],
        )  # fmt: skip
        return web.Response()

    tracing = Tracing(TracingConfig(), "gpuroute-test")
    tracing.start()  # no endpoint: nothing is made
    assert tracing.tracer is None
    request = make_mocked_request(
        "POST", "/v1/chat/completions", headers={"x-request-id": "abc", "traceparent": GOOD}
    )
    await middleware(tracing)(request, handler)
    rid = seen.pop("rid")  # its own, never the client's (which is any tenant's to reuse)
    assert re.fullmatch(r"[0-9a-f]{16}", rid)
    assert seen == {"log": rid, "tracer": None, "onward": {"traceparent": GOOD}, "client": "abc"}
    assert LOG_REQUEST_ID.get() is None  # reset after the request


def test_tracing_is_off_by_default() -> None:
    config = TracingConfig()
    assert config.otlp_endpoint is None and config.sample_ratio == 1.0
    with pytest.raises(ValueError):
        TracingConfig(sample_ratio=1.5)
    with pytest.raises(ValueError):
        TracingConfig(otlp_endpoint="file:///etc/passwd")
