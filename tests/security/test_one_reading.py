"""One reading of each header at every hop (issue 30 items 1 and 4).

The attack: `Authorization: Bearer junk` then `Authorization: Bearer <EU-only key>` at the
global tier. It read the first (an unknown key: no residency rule, an unrestricted
decision), the relay kept the last, and the router served the EU key in us-east."""

from __future__ import annotations

import pytest
from support.live import router_server, scripted_backend
from support.paths import shared_file
from support_security import KEY as ROUTER_KEY
from support_security import RecordingEngine, chat, keys_section, secure_toml, send_raw
from support_tiers import EU_KEY, KEY, two_regions

from gpuroute.headers import PREFIX, SINGLE_VALUED

JSON = [("Content-Type", "application/json")]
# every header a tier interprets, with a value each tier would accept alone
INTERPRETED = {
    "Authorization": f"Bearer {KEY}",
    "X-Api-Key": KEY,
    "X-Session-Id": "s-1",
    "x-gpuroute-session": "s-1",
    "x-gpuroute-priority": "normal",
    "x-gpuroute-deadline-ms": "5000",
    "x-gpuroute-slo": "interactive",
    "x-gpuroute-residency": "eu",
    "x-gpuroute-region": "eu-west",
    "x-gpuroute-tenant": "acme",
    "x-gpuroute-residency-decision": "v2;*;0;-;0;forged",
}


def test_the_list_covers_every_interpreted_header() -> None:
    names = {n.lower() for n in INTERPRETED}
    assert names >= SINGLE_VALUED and all(n in SINGLE_VALUED or n.startswith(PREFIX) for n in names)


def twice(name: str, key: str) -> list[tuple[str, str]]:
    """The header twice (once as spelled, once in lowercase), and a key unless the header
    is the key."""
    lines = [*JSON, (name, INTERPRETED[name]), (name.lower(), INTERPRETED[name])]
    return lines if name == "Authorization" else [*lines, ("Authorization", f"Bearer {key}")]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", INTERPRETED)
async def test_a_duplicated_header_is_refused_at_the_global_tier(tmp_path, name: str) -> None:
    async with two_regions(tmp_path) as tiers:
        answer = await send_raw(tiers.url, twice(name, KEY), chat())
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error["code"] == "duplicate_header" and error["param"] == name.lower()
    assert tiers.served_in() == {"eu-west": 0, "us-east": 0}


@pytest.mark.asyncio
@pytest.mark.parametrize("name", INTERPRETED)
async def test_a_duplicated_header_is_refused_at_the_router(tmp_path, name: str) -> None:
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, auth=keys_section())
        async with router_server(text, tmp_path) as server:
            answer = await send_raw(
                f"http://127.0.0.1:{server.port}", twice(name, ROUTER_KEY), chat()
            )
    assert answer.status == 400, answer.body
    assert answer.json()["error"]["code"] == "duplicate_header"
    assert engine.seen == []


@pytest.mark.asyncio
@pytest.mark.parametrize("second", ["Authorization", "authorization"])
@pytest.mark.parametrize("hint", [None, "us-east"])
async def test_two_keys_never_move_a_tenant_out_of_its_jurisdiction(
    tmp_path, second: str, hint: str | None
) -> None:
    """The high finding, end to end: refused in both orders and spellings; the EU key
    alone is served in eu-west whatever region it hints at."""
    hinted = [("x-gpuroute-region", hint)] if hint else []
    async with two_regions(tmp_path) as tiers:
        for first, last in (("junk", EU_KEY), (EU_KEY, "junk")):
            attack = [
                *JSON,
                *hinted,
                ("Authorization", f"Bearer {first}"),
                (second, f"Bearer {last}"),
            ]
            answer = await send_raw(tiers.url, attack, chat())
            assert answer.status == 400 and answer.json()["error"]["code"] == "duplicate_header"
        assert tiers.served_in() == {"eu-west": 0, "us-east": 0}
        alone = await send_raw(tiers.url, [*JSON, *hinted, (second, f"Bearer {EU_KEY}")], chat())
    assert alone.status == 200, alone.body
    assert alone.headers["x-gpuroute-region"] == "eu-west"
    assert tiers.served_in() == {"eu-west": 1, "us-east": 0}


@pytest.mark.asyncio
async def test_forwarded_for_lines_are_joined_and_each_peer_appended(tmp_path) -> None:
    """Item 4: a proxy that adds its own X-Forwarded-For line (HAProxy does) was read for
    its first line only; and the relay kept one line of several."""
    lines = [("X-Forwarded-For", "198.51.100.7"), ("x-forwarded-for", "203.0.113.9")]
    headers = [*JSON, ("Authorization", f"Bearer {KEY}"), *lines, ("x-gpuroute-region", "us-east")]
    async with two_regions(tmp_path) as tiers:
        answer = await send_raw(tiers.url, headers, chat())
    assert answer.status == 200, answer.body
    [(_, seen, _)] = tiers.engines["us-east"].seen
    # the client's two lines in order, then the global tier's peer, then the router's
    assert seen["X-Forwarded-For"] == "198.51.100.7, 203.0.113.9, 127.0.0.1, 127.0.0.1"


@pytest.mark.asyncio
@pytest.mark.shared_data
async def test_a_proxys_own_forwarded_line_decides_the_country(tmp_path) -> None:
    """With a trusted proxy's line last, a client claiming a US address on its own line is
    placed where the proxy saw it (Sweden: eu only), however it hints."""
    geoip = shared_file("maxmind-test/GeoIP2-City-Test.mmdb")
    top = f'geoip_database = "{geoip}"\ntrusted_proxies = ["127.0.0.1/32"]'
    countries = 'countries = { SE = ["eu"], US = ["us"] }'
    lines = [("X-Forwarded-For", "216.160.83.56"), ("X-Forwarded-For", "89.160.20.112:4711")]
    headers = [*JSON, ("Authorization", f"Bearer {KEY}"), *lines, ("x-gpuroute-region", "us-east")]
    async with two_regions(tmp_path, global_top=top, residency=countries) as tiers:
        answer = await send_raw(tiers.url, headers, chat())
    assert answer.status == 200, answer.body
    assert answer.headers["x-gpuroute-region"] == "eu-west"
    assert tiers.served_in() == {"eu-west": 1, "us-east": 0}
