"""Placing clients: trusted proxies, GeoIP with MaxMind's test databases, bad input."""

from __future__ import annotations

import pytest
from gpuroute.global_.client import ClientLocator
from support.paths import shared_file


def test_forwarded_for_counts_only_from_trusted_proxies() -> None:
    loc = ClientLocator(None, ["10.0.0.0/8"])
    assert loc.proxies.client_address("203.0.113.9", "81.2.69.142") == "203.0.113.9"
    assert loc.proxies.client_address("10.1.2.3", "81.2.69.142") == "81.2.69.142"
    # a client prepending a fake hop: the last untrusted address wins
    assert loc.proxies.client_address("10.1.2.3", "1.1.1.1, 81.2.69.142, 10.9.9.9") == "81.2.69.142"
    assert loc.proxies.client_address("10.1.2.3", "") == "10.1.2.3"
    assert loc.proxies.client_address(None, "81.2.69.142") is None


@pytest.mark.parametrize(
    ("entry", "address"),
    [
        ("81.2.69.142:5123", "81.2.69.142"),
        ("[2001:db8::7]:443", "2001:db8::7"),
        ("[2001:db8::7]", "2001:db8::7"),
        ("2001:db8::7", "2001:db8::7"),
        ('"81.2.69.142"', "81.2.69.142"),
        ("::ffff:81.2.69.142", "81.2.69.142"),
    ],
)
def test_forwarded_entries_with_ports_are_addresses(entry: str, address: str) -> None:
    """Issue 30 item 4: `ip:port` entries were unplaced, and fell open under
    `unknown_country = ["*"]`."""
    loc = ClientLocator(None, ["10.0.0.0/8"])
    assert loc.proxies.client_address("10.1.2.3", entry) == address
    # a trusted proxy's own entry, port and all, is walked past like its bare address
    assert loc.proxies.client_address("10.1.2.3", f"{entry}, 10.9.9.9:80") == address


@pytest.mark.parametrize(
    "entry", ["81.2.69.142:", "81.2.69.142:port", "[2001:db8::7]x", "1.2.3.4:99999", "unknown"]
)
def test_entries_that_are_no_address_leave_the_client_unplaced(entry: str) -> None:
    place = ClientLocator(None, ["10.0.0.0/8"]).place("10.1.2.3", entry)
    assert place.country is None and place.why_unplaced == "not an IP address"


@pytest.mark.parametrize(
    ("peer", "why"),
    [
        ("127.0.0.1", "private or reserved"),
        ("10.0.0.7", "private or reserved"),
        ("fe80::1", "private or reserved"),
        ("not-an-ip", "not an IP address"),
        (None, "not an IP address"),
        ("81.2.69.142", "no GeoIP database configured"),
    ],
)
def test_unplaceable_clients_are_unplaced_with_a_reason(peer, why) -> None:
    place = ClientLocator(None, []).place(peer)
    assert place.location is None and place.country is None and why in place.why_unplaced


@pytest.mark.shared_data
def test_known_answers_from_maxminds_test_database() -> None:
    db = shared_file("maxmind-test/GeoIP2-City-Test.mmdb")
    loc = ClientLocator(str(db), ["10.0.0.0/8"])
    try:
        london = loc.place("81.2.69.142")
        assert london.country == "GB"
        assert (london.location.lat, london.location.lon) == (51.5142, -0.0931)
        assert loc.place("10.0.0.1", "89.160.20.112").country == "SE"  # via a trusted proxy
        assert loc.place("::ffff:216.160.83.56").country == "US"  # IPv4-mapped IPv6
        missing = loc.place("8.8.8.8")
        assert missing.location is None and "not in the GeoIP database" in missing.why_unplaced
    finally:
        loc.close()


@pytest.mark.shared_data
def test_a_country_database_is_a_clear_unplaced_reason_not_a_crash() -> None:
    db = shared_file("maxmind-test/GeoIP2-Country-Test.mmdb")
    loc = ClientLocator(str(db), [])
    try:
        place = loc.place("81.2.69.142")
        assert place.location is None and "GeoIP lookup failed" in place.why_unplaced
    finally:
        loc.close()


def test_per_client_limits_count_an_ipv6_clients_whole_64() -> None:
    """A host gets a /64 and may rotate through it: each address its own client would
    make a per-client cap no cap at all."""
    from gpuroute.listener import ConnectionCap

    cap = ConnectionCap(2)
    assert cap.acquire("2001:db8:1:2::1") and cap.acquire("2001:db8:1:2:ffff::9")
    assert not cap.acquire("2001:db8:1:2:aaaa::3")  # the same /64
    assert cap.acquire("2001:db8:1:3::1")  # another /64
    cap.release("2001:db8:1:2::1")
    assert cap.acquire("2001:db8:1:2:bbbb::4")
    assert cap.acquire("198.51.100.1") and cap.acquire("198.51.100.1")
    assert not cap.acquire("198.51.100.1") and cap.acquire("198.51.100.2")
