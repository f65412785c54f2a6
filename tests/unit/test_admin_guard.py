"""The admin guard's rule, exactly (gpuroute/admin_guard.py; the attacks against live
listeners are in tests/security): which `Host` is loopback, and what each refusal says."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gpuroute.admin_guard import READS, AdminGuard


def request(method: str = "GET", remote: str = "127.0.0.1", **headers: str):
    fields = CIMultiDict(headers.items())
    return make_mocked_request(method, "/admin/config", headers=fields).clone(remote=remote)


def code(answer) -> str | None:
    return None if answer is None else json.loads(answer.body)["error"]["code"]


TOKENLESS = AdminGuard(None, lambda _request: True)
WITH_TOKEN = AdminGuard("s3cret", lambda r: r.method in READS)


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST:9090",
        "127.0.0.1",
        "127.0.0.1:9090",
        "127.3.2.1:1",
        "[::1]:9090",
        "[::1]",
    ],
)
def test_a_loopback_host_is_answered_without_a_token(host: str) -> None:
    assert TOKENLESS.refusal(request(Host=host)) is None


@pytest.mark.parametrize(
    "host",
    [
        "evil.test",
        "evil.test:9090",
        "localhost.",
        "127.0.0.1.nip.io",
        "0.0.0.0:9090",
        "10.0.0.5",
        "",
    ],
)
def test_any_other_host_is_refused_without_a_token(host: str) -> None:
    assert code(TOKENLESS.refusal(request(Host=host))) == "host_not_loopback"


def test_a_caller_off_loopback_or_two_hosts_are_refused_without_a_token() -> None:
    assert (
        code(TOKENLESS.refusal(request(remote="10.0.0.7", Host="127.0.0.1"))) == "host_not_loopback"
    )
    two = make_mocked_request(
        "GET", "/admin/config", headers=CIMultiDict([("Host", "127.0.0.1"), ("Host", "evil.test")])
    ).clone(remote="127.0.0.1")
    assert code(TOKENLESS.refusal(two)) == "host_not_loopback"


def test_origin_and_a_body_that_is_not_json_are_refused_token_or_not() -> None:
    bearer = {"Authorization": "Bearer s3cret"}
    for guard, extra in ((TOKENLESS, {}), (WITH_TOKEN, bearer)):
        page = request(Host="127.0.0.1", Origin="null", **extra)
        assert code(guard.refusal(page)) == "cross_origin_refused"
        form = request("POST", Host="127.0.0.1", **{"Content-Type": "text/plain"}, **extra)
        assert code(guard.refusal(form)) == "json_required"
        bare = request("DELETE", Host="127.0.0.1", **extra)  # no body: still JSON
        assert code(guard.refusal(bare)) == "json_required"
        json_write = request(
            "POST", Host="127.0.0.1", **{"Content-Type": "application/json; charset=utf-8"}, **extra
        )
        assert guard.refusal(json_write) is None


def test_with_a_token_any_host_is_answered_and_writes_need_the_token() -> None:
    assert WITH_TOKEN.refusal(request(Host="router-1.internal:9090")) is None  # a read
    write = request("POST", Host="router-1.internal", **{"Content-Type": "application/json"})
    assert code(WITH_TOKEN.refusal(write)) == "invalid_admin_token"
