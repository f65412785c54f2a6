"""Consul entries as untrusted input (issue 16 item 13): an entry without checks counted as
passing, and an unbounded Meta `capacity` could pull a region's traffic onto one entry."""

from __future__ import annotations

from gpuroute.router.core.membership import MAX_CAPACITY, members_from_entries


def entry(sid: str, *, checks: list | None = None, **meta: str) -> dict:
    return {
        "Node": {"Node": "n1", "Address": "10.0.0.1"},
        "Service": {
            "ID": sid,
            "Address": "10.0.0.2",
            "Port": 8000,
            "Meta": {"gpu_model": "H100", "models": "m", "load_port": "7070"} | meta,
        },
        "Checks": [{"CheckID": f"gpuroute-agent:{sid}", "Status": "passing"}]
        if checks is None
        else checks,
    }


def test_an_entry_without_checks_is_never_routable() -> None:
    members, _ = members_from_entries([entry("fake", checks=[])], ["H100"])
    assert not members["fake"].routable


def test_meta_is_validated() -> None:
    members, problems = members_from_entries(
        [
            entry("greedy", capacity=str(MAX_CAPACITY * 1000)),
            entry("negative", capacity="-1"),
            entry("odd-scheme", scheme="gopher"),
            entry("tls", scheme="https", capacity="0.5"),
        ],
        ["H100"],
    )
    assert set(members) == {"tls"}
    assert members["tls"].url == "https://10.0.0.2:8000"
    assert len(problems) == 3 and all("Meta" in p for p in problems)


def test_an_id_registered_on_two_nodes_is_kept_on_neither() -> None:
    """A `service:write` token registers a real agent's service ID on its own node, with
    its own engine's address: it would pass the load stream's backend check (the real
    agent's reports name that ID) and displace the real entry. Neither is kept."""
    real = entry("engine-host-1")
    forged = entry("engine-host-1")
    forged["Node"] = {"Node": "attacker", "Address": "10.6.6.6"}
    forged["Service"]["Address"] = "10.6.6.6"
    members, problems = members_from_entries([real, forged, entry("other")], ["H100"])
    assert set(members) == {"other"}
    assert problems == ["engine-host-1: registered 2 times (on several nodes): none kept"]
