"""What the next hop gets of a client's headers (issue 30 item 10): engines received
`x-gpuroute-tenant`, `-priority`, `-region` and `-backend`, the client's own
X-Forwarded-For with the peer not appended, `X-Forwarded-Host`, `Cookie`, and a fake-engine
test knob. Now each hop forwards an allow-list, and appends its peer."""

from __future__ import annotations

import re

import pytest
from support.global_tier import global_tier
from support.live import router_server, scripted_backend
from support_security import RecordingEngine, chat, secure_toml, send_raw

pytestmark = pytest.mark.asyncio
SMUGGLED = [
    ("x-gpuroute-tenant", "someone-else"),
    ("x-gpuroute-priority", "normal"),
    ("x-gpuroute-region", "eu-west"),
    ("x-gpuroute-backend", "engine-7"),
    ("x-gpuroute-residency", "eu"),
    ("X-Forwarded-Host", "internal.example"),
    ("X-Forwarded-Proto", "https"),
    ("Forwarded", "for=10.0.0.1"),
    ("X-Real-IP", "10.0.0.1"),
    ("Cookie", "session=stolen"),
    ("x-fake-output-tokens", "100000"),
    ("Authorization", "Bearer sk-client"),
]
WANTED = [
    ("Content-Type", "application/json"),
    ("Accept", "text/event-stream"),
    ("User-Agent", "OpenAI/Python 1.0"),
    ("X-Request-Id", "req-1"),
    ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ("X-Forwarded-For", "203.0.113.9"),
]


PASSTHROUGH = "/v1/load_lora_adapter"  # an engine path the router forwards unparsed
PASSED = {"content-type", "accept", "user-agent", "traceparent", "x-forwarded-for"}
FRAMING = {"host", "content-length", "connection"}  # the client library's own


def received(seen: dict[str, str]) -> tuple[set[str], dict[str, str]]:
    """The names that arrived besides framing, and every header by lowercase name."""
    got = {k.lower(): v for k, v in seen.items()}
    return set(got) - FRAMING, got


@pytest.mark.parametrize("path", ["/v1/chat/completions", PASSTHROUGH])
async def test_an_engine_gets_only_what_it_needs(tmp_path, path) -> None:
    """The same on a parsed route and on a passthrough path (forwarded as it came: the
    passthrough once sent only the peer as X-Forwarded-For, the client's chain lost)."""
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        secret = tmp_path / "engine-key"
        secret.write_text("sk-engine-only\n")
        top = f'engine_api_key_file = "{secret}"\npassthrough_paths = ["{PASSTHROUGH}"]'
        async with router_server(secure_toml(url, top=top), tmp_path) as server:
            url = f"http://127.0.0.1:{server.port}"
            answer = await send_raw(url, WANTED + SMUGGLED, chat(), path)
    assert answer.status == 200, answer.body
    [(seen_path, seen, _)] = engine.seen
    assert seen_path == path
    names, got = received(seen)
    assert names == PASSED | {"authorization", "x-request-id"}
    assert got["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"  # the peer appended
    # the router's own id (never the client's: issue 42 finding 10) with the attempt and a
    # nonce: unique per attempt (gpuroute/tracing.py)
    rid = answer.headers["x-request-id"]
    assert re.fullmatch(rf"{rid}-0-[0-9a-f]{{8}}", got["x-request-id"]), got["x-request-id"]
    assert "req-1" not in got["x-request-id"]
    assert got["traceparent"] == dict(WANTED)["traceparent"]  # valid, tracing off: as it came
    assert got["authorization"] == "Bearer sk-engine-only"


async def test_an_operator_may_let_more_through_but_never_keys_or_control_headers(
    tmp_path,
) -> None:
    from gpuroute.router.config.router import RouterConfig

    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, top='engine_headers = ["x-fake-output-tokens", "X-Tenant-Tag"]')
        async with router_server(text, tmp_path) as server:
            headers = [*WANTED, ("x-tenant-tag", "blue"), *SMUGGLED]
            answer = await send_raw(f"http://127.0.0.1:{server.port}", headers, chat())
    assert answer.status == 200
    _, got = received(engine.seen[0][1])
    assert got["x-fake-output-tokens"] == "100000" and got["x-tenant-tag"] == "blue"
    for forbidden in (
        "Authorization", "cookie", "x-gpuroute-tenant", "X-Forwarded-For", "Host",
        "Content-Encoding", "TE", "Upgrade", "Forwarded", "X-Forwarded-Host",
    ):  # fmt: skip
        with pytest.raises(ValueError, match="never passed on to engines"):
            RouterConfig(engine_headers=[forbidden], backends=[])


async def test_a_router_gets_only_what_it_reads_from_the_global_tier(tmp_path) -> None:
    router = RecordingEngine()  # stands in for the region's router
    async with scripted_backend(router) as region:
        async with global_tier(tmp_path, region) as (url, _app):
            answer = await send_raw(url, WANTED + SMUGGLED[:-1], chat())
    assert answer.status == 200, answer.body
    [(_, seen, _)] = router.seen
    names, got = received(seen)
    assert names == PASSED | {"x-request-id", "x-gpuroute-priority"}
    assert got["x-request-id"] == answer.headers["x-request-id"] != "req-1"  # the tier's own
    assert got["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
