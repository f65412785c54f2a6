"""Header lists as an attacker writes them (duplicates, case variants, repeated lines, ports)
against both tiers (issue 30, "what it must show").

In process: the global tier and the router behind it come to the same tenant and the same
client address for every list, or both refuse it. Live: across the global tier and two
regions (eu-west in the eu, us-east in the us), no request is served outside what its own
lines allow, whichever copy of a header a reader might have picked."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from pathlib import Path

import pytest
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import GlobalApp
from gpuroute.router.config.router import load_router_config
from gpuroute.router.http.server import RouterApp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.paths import REPO, SHARED_DATA
from support_security import chat, post_raw
from support_tiers import EU_KEY, KEY, global_residency, router_sections, two_regions

from gpuroute.forwarded import parse_hop
from gpuroute.headers import interpreted, router_headers
from gpuroute.openai_api import Rejection

GLOBAL_ADDRESS = "192.0.2.10"  # where the router sees the global tier's requests from
LONDON, SWEDEN, MILTON_US = "81.2.69.142", "89.160.20.112", "216.160.83.56"
SPELLINGS = {
    "authorization": ("Authorization", "authorization", "AUTHORIZATION"),
    "x-forwarded-for": ("X-Forwarded-For", "x-forwarded-for", "X-FORWARDED-FOR"),
    "x-gpuroute-residency": ("x-gpuroute-residency", "X-Gpuroute-Residency"),
    "x-gpuroute-region": ("x-gpuroute-region", "X-GPUROUTE-REGION"),
    "x-gpuroute-tenant": ("x-gpuroute-tenant", "X-Gpuroute-Tenant"),
    "accept": ("Accept", "accept"),
}
VALUES = {
    "authorization": (f"Bearer {KEY}", f"bearer {EU_KEY}", f"BEARER  {EU_KEY} ", "Bearer junk",
                      "Basic abc", "Bearer"),
    "x-forwarded-for": (LONDON, f"{SWEDEN}:4711", MILTON_US, "10.0.0.9", f"{MILTON_US}, 10.1.2.3",
                        "garbage", "[2001:db8::1]:80", f"{SWEDEN}, {MILTON_US}"),
    "x-gpuroute-residency": ("eu", "us", "eu,us"),
    "x-gpuroute-region": ("us-east", "eu-west"),
    "x-gpuroute-tenant": ("acme-eu", "acme"),
    "accept": ("*/*", "text/event-stream"),
}  # fmt: skip


def one_line(name: str) -> st.SearchStrategy[tuple[str, str]]:
    return st.tuples(st.sampled_from(SPELLINGS[name]), st.sampled_from(VALUES[name]))


header_lists = st.lists(st.sampled_from(sorted(SPELLINGS)).flatmap(one_line), max_size=6)
# lists that carry a valid key somewhere, so that many get as far as being served
keyed_lists = st.tuples(
    st.tuples(
        st.sampled_from(SPELLINGS["authorization"]), st.sampled_from(VALUES["authorization"][:3])
    ),
    header_lists,
    st.integers(0, 6),
).map(lambda drawn: [*drawn[1][: drawn[2]], drawn[0], *drawn[1][drawn[2] :]])


# -- in process: the same tenant and client at both tiers ---------------------------------
@pytest.fixture(scope="module")
def tiers():
    """A global tier (trusting 10.0.0.0/8 in front of it) and a router (trusting those and
    the global tier), built from config as the processes build them, not started."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder)
        (path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
        top = 'trusted_proxies = ["10.0.0.0/8"]'
        (path / "global.toml").write_text(
            'regions_file = "regions.toml"\n'
            + global_residency(top=top, residency="allow_anonymous = true")
            + '[[endpoints]]\nregion = "eu-west"\nurl = "http://127.0.0.1:9"\n'
            + 'report = "127.0.0.1:9"\n'
        )
        router_top = f'trusted_proxies = ["10.0.0.0/8", "{GLOBAL_ADDRESS}/32"]'
        sections = router_sections("eu-west", top=router_top).replace(
            "[region]", "[auth]\nallow_anonymous = true\n[region]"
        )
        (path / "router.toml").write_text(
            sections + '[[backends]]\nurl = "http://127.0.0.1:9"\ngpu = "H100"\nmodels = ["m"]\n'
        )
        yield (
            GlobalApp(*load_global_config(path / "global.toml")),
            RouterApp(load_router_config(path / "router.toml")),
        )


def router_reading(router: RouterApp, items, peer: str) -> tuple[str | None, str | None]:
    """(tenant, client) as the router's front stages read them; tenant None when it
    refuses the key or serves the caller as anonymous."""
    front = router.proxy.front
    read = interpreted(items)
    try:
        tenant = front.tenants.identify(read).tenant
    except Rejection:
        tenant = None
    return (None if tenant == "anonymous" else tenant), front.client(read, peer)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=header_lists, peer=st.sampled_from(["10.0.0.5", "198.51.100.1"]))
def test_both_tiers_come_to_the_same_tenant_and_client(tiers, lines, peer) -> None:
    front_tier, router = tiers
    try:
        read = interpreted(lines)
        tenant = front_tier.tenant(read, peer)
    except Rejection as refused:
        if refused.code == "duplicate_header":  # the router, called directly, refuses too
            with pytest.raises(Rejection):
                interpreted(lines)
        return
    client = front_tier.locator.proxies.client_address(peer, read.get("x-forwarded-for"))
    forwarded = router_headers(lines, read, peer)
    router_tenant, router_client = router_reading(router, list(forwarded.items()), GLOBAL_ADDRESS)
    assert router_client == client
    named = read.get("x-gpuroute-tenant") if front_tier.locator.trusted(peer) else None
    assert router_tenant == tenant or (named is not None and tenant == named)


# -- live: no request leaves its jurisdictions -------------------------------------------
@contextlib.contextmanager
def live_tiers(tmp_path: Path, geoip: Path | None):
    """two_regions (support_tiers.py) on an event loop of its own, for a synchronous test."""
    ready, stop, box = threading.Event(), threading.Event(), {}
    top = 'trusted_proxies = ["127.0.0.1/32"]'
    countries = ""
    if geoip is not None:
        top += f'\ngeoip_database = "{geoip}"'
        countries = 'countries = { SE = ["eu"], US = ["us"], GB = ["eu", "us"] }'

    async def serve() -> None:
        async with two_regions(tmp_path, global_top=top, residency=countries) as tiers:
            box["tiers"] = tiers
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)  # a poll of the stop flag, not a synchronisation

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    try:
        assert ready.wait(30), "the tiers did not start"
        yield box["tiers"]
    finally:
        stop.set()
        thread.join(30)


def allowed_regions(lines: list[tuple[str, str]], geoip: bool) -> set[str]:
    """Where these lines may be served, from the lines themselves (no reader's choice):
    any copy of the EU key, any `eu`-only residency line, or (with GeoIP) a client placed
    in Sweden by the chain's last entry keeps a request in eu-west; `us`-only lines or a
    US client keep it in us-east."""
    regions = {"eu-west", "us-east"}
    for name, value in lines:
        lower = name.lower()
        if lower == "authorization" and EU_KEY in value:
            regions &= {"eu-west"}
        if lower == "x-gpuroute-residency" and value in ("eu", "us"):
            regions &= {"eu-west" if value == "eu" else "us-east"}
    forwarded = [v for n, v in lines if n.lower() == "x-forwarded-for"]
    if geoip and forwarded:
        last = parse_hop(", ".join(forwarded).split(",")[-1])
        if str(last) == SWEDEN:
            regions &= {"eu-west"}
        elif str(last) == MILTON_US:
            regions &= {"us-east"}
    return regions


def test_no_request_leaves_its_jurisdictions_live(tmp_path) -> None:
    geoip = SHARED_DATA / "maxmind-test" / "GeoIP2-City-Test.mmdb"
    geoip = geoip if geoip.is_file() else None
    with live_tiers(tmp_path, geoip) as tiers:
        served = {"eu-west": 0, "us-east": 0}

        @settings(max_examples=400, deadline=None, database=None)
        @given(lines=st.one_of(header_lists, keyed_lists))
        def check(lines) -> None:
            answer = post_raw(tiers.url, [("Content-Type", "application/json"), *lines], chat())
            now = tiers.served_in()
            if answer.status != 200:
                assert now == served, (lines, answer.status)
                return
            region = answer.headers["x-gpuroute-region"]
            assert now[region] == served[region] + 1, lines
            served[region] += 1
            assert region in allowed_regions(lines, geoip is not None), (lines, region)

        check()
