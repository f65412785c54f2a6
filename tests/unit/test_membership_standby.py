"""Standby through Consul (issue 36): a member whose agent stands by is out of rotation
unless the router promoted it, an active one is in, and critical wins over both. Exact
states and reasons on small fleets."""

from __future__ import annotations

from dataclasses import replace

from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.membership import Member, apply, members_from_entries, plan
from gpuroute.router.core.standby import PROMOTED, RELEASED, StandbyRotation

READY, STANDBY, DRAINING, WARMING = (
    BackendState.READY,
    BackendState.STANDBY,
    BackendState.DRAINING,
    BackendState.WARMING,
)


def member(sid: str, status: str = "passing", *, standby: bool = False) -> Member:
    return Member(sid, f"http://{sid}:8000", "H100", ("m",), status, "why", standby=standby)


def sync(backends: BackendSet, managed: set[str], members: dict[str, Member], now: float):
    changes = plan(backends, managed, members)
    added = apply(backends, changes, members, now, capacity_of=lambda m: 1.0, warm=now > 0)
    managed.update(b.backend_id for b in added)
    return changes


def states(backends: BackendSet) -> dict[str, tuple[BackendState, str]]:
    return {b.backend_id: (b.state, b.reason) for b in backends}


def test_meta_standby_true_alone_makes_a_standby_member() -> None:
    def entry(sid: str, **meta: str) -> dict:
        return {
            "Service": {"ID": sid, "Address": "10.0.0.1", "Port": 8000,
                        "Meta": {"gpu_model": "H100", "models": "m"} | meta},
            "Checks": [{"CheckID": f"gpuroute-agent:{sid}", "Status": "passing"}],
        }  # fmt: skip

    entries = [entry("on", standby="true"), entry("off", standby="false"), entry("old"),
               entry("odd", standby="True")]  # fmt: skip
    members, problems = members_from_entries(entries, ("H100",))
    assert problems == []
    assert {sid: m.standby for sid, m in members.items()} == {
        "on": True, "off": False, "old": False, "odd": False,
    }  # fmt: skip


def test_standby_joins_out_of_rotation_and_follows_its_agent_in_and_out() -> None:
    backends, managed = BackendSet(), set()
    members = {"a": member("a"), "s": member("s", standby=True)}
    sync(backends, managed, members, 0.0)
    assert states(backends) == {"a": (READY, "consul: joined"), "s": (STANDBY, "consul: standby")}
    assert not sync(backends, managed, members, 1.0)  # steady: nothing to change
    members["s"] = member("s")  # `gpuroute agent activate`
    changes = sync(backends, managed, members, 2.0)
    assert (changes.active, changes.standby) == (["s"], [])
    assert states(backends)["s"] == (READY, "consul: active")
    members["a"] = member("a", standby=True)  # `gpuroute agent standby` on a serving host
    changes = sync(backends, managed, members, 3.0)
    assert (changes.active, changes.standby) == ([], ["a"])
    assert states(backends)["a"] == (STANDBY, "consul: standby")
    assert [b.backend_id for b in backends.routable("m")] == ["s"]


def test_a_promoted_standby_stays_until_released_or_its_agent_activates() -> None:
    backends, managed = BackendSet(), set()
    members = {"a": member("a"), "s": member("s", standby=True), "t": member("t", standby=True)}
    sync(backends, managed, members, 0.0)
    rotation = StandbyRotation(backends, release_after_s=10.0)
    promoted = [rotation.promote("m", 1.0), rotation.promote("m", 1.0)]
    assert [b.backend_id for b in promoted] == ["s", "t"]  # equal capacity: by id
    assert not sync(backends, managed, members, 2.0)  # the router's say-so stands
    assert states(backends)["s"] == (READY, PROMOTED)
    members["t"] = member("t")  # activated for good: the router no longer owns it
    sync(backends, managed, members, 3.0)
    assert states(backends)["t"] == (READY, "consul: active")
    assert [b.backend_id for b in rotation.release(4.0, lambda b: True)] == []
    assert [b.backend_id for b in rotation.release(14.0, lambda b: True)] == ["s"]
    assert states(backends) == {
        "a": (READY, "consul: joined"), "s": (STANDBY, RELEASED), "t": (READY, "consul: active"),
    }  # fmt: skip
    assert (rotation.promoted_into["m"], rotation.released_from["m"]) == (2, 1)
    assert not sync(backends, managed, members, 15.0)  # released: standby, as Consul says


def test_critical_wins_over_standby_and_a_recovery_goes_back_where_the_agent_says() -> None:
    backends, managed = BackendSet(), set()
    members = {"s": member("s", standby=True), "c": member("c", "critical", standby=True)}
    sync(backends, managed, members, 0.0)
    assert states(backends) == {
        "s": (STANDBY, "consul: standby"),
        "c": (DRAINING, "consul: critical"),
    }
    members["s"] = member("s", "critical", standby=True)
    assert sync(backends, managed, members, 1.0).down == ["s"]
    assert states(backends)["s"] == (DRAINING, "consul: why")
    members = {sid: replace(m, status="passing") for sid, m in members.items()}
    changes = sync(backends, managed, members, 2.0)
    assert (changes.standby, changes.up) == (["s", "c"], [])  # in the catalog's order
    assert states(backends) == {
        "s": (STANDBY, "consul: standby"),
        "c": (STANDBY, "consul: standby"),
    }
    members["s"] = member("s", "critical")  # active and critical: drains as ever
    sync(backends, managed, members, 3.0)
    members["s"] = member("s")
    assert sync(backends, managed, members, 4.0).up == ["s"]
    assert states(backends)["s"] == (WARMING, "consul: back")


def test_an_ejected_backend_is_left_to_health_when_its_agent_stands_by() -> None:
    backends = BackendSet([Backend("static", "H100", ["m"])])
    managed: set[str] = set()
    members = {"a": member("a")}
    sync(backends, managed, members, 0.0)
    backends.set_state(backends.get("a"), BackendState.EJECTED, 1.0, "breaker open")
    members["a"] = member("a", standby=True)
    assert not sync(backends, managed, members, 2.0)
    assert states(backends)["a"] == (BackendState.EJECTED, "breaker open")
    backends.set_state(backends.get("a"), WARMING, 3.0, "ejection ended")  # health's return
    assert sync(backends, managed, members, 4.0).standby == ["a"]
    assert states(backends)["static"] == (READY, "configured")  # never touched
