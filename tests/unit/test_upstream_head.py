"""The request head the router writes to engines: framing its own, injection refused."""

from __future__ import annotations

import pytest

from gpuroute.upstream import Origin, request_head


def test_header_injection_is_refused_and_framing_is_never_the_callers() -> None:
    origin = Origin.parse("http://engine:8000")
    head = request_head(
        "POST", "/v1/x", origin, {"Host": "evil", "Content-Length": "9", "X-A": "b"}, 2
    )
    assert (
        head == b"POST /v1/x HTTP/1.1\r\nHost: engine:8000\r\nContent-Length: 2\r\nX-A: b\r\n\r\n"
    )
    for bad in ({"X-A": "b\r\nX-Evil: 1"}, {"X-A\r\nX-Evil": "1"}, {"X A": "1"}):
        with pytest.raises(ValueError):
            request_head("POST", "/", origin, bad, 0)
    with pytest.raises(ValueError):
        request_head("POST", "/ HTTP/1.1\r\nX-Evil: 1", origin, {}, 0)


def test_origins_name_their_host_header_as_browsers_do() -> None:
    assert Origin.parse("https://e.example").host_header == "e.example"
    assert Origin.parse("https://e.example:8443").port == 8443
    assert Origin.parse("http://[::1]:9000").host_header == "[::1]:9000"
    with pytest.raises(ValueError):
        Origin.parse("ftp://e.example")
