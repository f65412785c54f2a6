"""Membership and agent-load cores: exact expectations on small fleets, and Consul's index
rules as properties."""

from __future__ import annotations

from gpuroute.router.core.agent_load import AgentLoadView, AgentReport
from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.membership import (
    Member,
    apply,
    members_from_entries,
    plan,
    recovered,
    removable,
)
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.consul_client import next_index

GPUS = ("H100", "A100", "L4")


def entry(sid: str, *, status: str = "passing", gpu: str = "H100", serf: str = "passing",
          address: str = "10.0.0.1", port: int = 8000, **meta: str) -> dict:  # fmt: skip
    return {
        "Node": {"Node": "n1", "Address": "10.9.9.9"},
        "Service": {
            "ID": sid,
            "Address": address,
            "Port": port,
            "Meta": {"gpu_model": gpu, "models": "m1,m2", "load_port": "7070"} | meta,
        },
        "Checks": [
            {"CheckID": "serfHealth", "Status": serf, "Output": "Agent alive and reachable"},
            {"CheckID": f"gpuroute-agent:{sid}", "Status": status, "Output": f"{status}: x"},
        ],
    }


def test_entries_become_members_with_the_worst_check_status() -> None:
    members, problems = members_from_entries(
        [
            entry("a"),
            entry("b", status="warning", capacity="0.5", zone="z1"),
            entry("c", serf="critical"),
            entry("d", gpu="B300"),
            entry("e", address="", port=0),
        ],
        GPUS,
    )
    assert problems == [
        "d: unknown gpu_model 'B300' or no models in Meta",
        "entry without ID, address or port: e",
    ]
    assert members["a"] == Member(
        "a", "http://10.0.0.1:8000", "H100", ("m1", "m2"), "passing", "passing: x",
        load_address="10.0.0.1:7070",
    )  # fmt: skip
    assert (members["b"].status, members["b"].capacity, members["b"].zone) == ("warning", 0.5, "z1")
    assert (members["c"].status, members["c"].output) == ("critical", "Agent alive and reachable")
    assert members["b"].routable and not members["c"].routable


def test_service_without_address_uses_the_node_address_and_ipv6_is_bracketed() -> None:
    members, _ = members_from_entries([entry("a", address=""), entry("b", address="fd00::1")], GPUS)
    assert members["a"].url == "http://10.9.9.9:8000"
    assert members["b"].url == "http://[fd00::1]:8000"
    assert members["b"].load_address == "[fd00::1]:7070"


def member(sid: str, status: str = "passing") -> Member:
    return Member(sid, f"http://{sid}:8000", "H100", ("m",), status)


def sync(backends: BackendSet, managed: set[str], members: dict, now: float, vouched=()) -> None:
    changes = plan(backends, managed, members, vouched)
    added = apply(backends, changes, members, now, capacity_of=lambda m: 1.0, warm=now > 0)
    managed.update(b.backend_id for b in added)
    for sid in removable(backends, managed, members, vouched):
        backends.remove(sid)
        managed.discard(sid)


def test_join_down_up_leave_lifecycle() -> None:
    backends = BackendSet([Backend("static", "H100", ["m"])])
    managed: set[str] = set()
    sync(backends, managed, {"a": member("a"), "b": member("b")}, 0.0)
    assert {b.backend_id: b.state for b in backends} == {
        "static": BackendState.READY, "a": BackendState.READY, "b": BackendState.READY,
    }  # fmt: skip
    sync(backends, managed, {"a": member("a"), "b": member("b"), "c": member("c")}, 5.0)
    assert backends.get("c").state is BackendState.WARMING  # a join after startup: slow start
    sync(backends, managed, {"a": member("a", "critical"), "b": member("b"), "c": member("c")}, 6)
    assert backends.get("a").state is BackendState.DRAINING
    assert backends.get("a").reason == "consul: critical"
    sync(backends, managed, {"a": member("a"), "b": member("b"), "c": member("c")}, 7.0)
    assert backends.get("a").state is BackendState.WARMING
    backends.get("b").in_flight = 2  # a request still streaming
    sync(backends, managed, {"a": member("a"), "c": member("c")}, 8.0)
    assert backends.get("b").state is BackendState.DRAINING and "b" in backends
    backends.get("b").in_flight = 0
    sync(backends, managed, {"a": member("a"), "c": member("c")}, 9.0)
    assert "b" not in backends and "static" in backends  # static ones are never touched


def test_a_vouched_backend_survives_an_empty_catalog() -> None:
    backends, managed = BackendSet(), set()
    sync(backends, managed, {"a": member("a"), "b": member("b")}, 0.0)
    sync(backends, managed, {}, 1.0, vouched={"a"})  # Consul restarted: catalog empty
    assert backends.get("a").state is BackendState.READY
    assert "b" not in backends


def test_outlier_ejection_is_not_undone_by_membership() -> None:
    backends, managed = BackendSet(), set()
    sync(backends, managed, {"a": member("a")}, 0.0)
    backends.set_state(backends.get("a"), BackendState.EJECTED, 1.0, "breaker open")
    sync(backends, managed, {"a": member("a")}, 2.0)
    assert backends.get("a").state is BackendState.EJECTED


def test_a_member_critical_at_join_is_added_draining() -> None:
    backends, managed = BackendSet(), set()
    sync(backends, managed, {"a": member("a", "critical")}, 3.0)
    assert backends.get("a").state is BackendState.DRAINING


@given(st.integers(0, 2**40), st.integers(-5, 2**40))
def test_blocking_query_index_never_below_one_and_resets_when_it_goes_backwards(prev, got):
    index = next_index(prev, got)
    assert index >= 1
    if got < prev:
        assert index == 1
    else:
        assert index == max(1, got)


def report(ts: float, received: float, running: int = 0, waiting: int = 0,
           health: str = "passing") -> AgentReport:  # fmt: skip
    return AgentReport(1, ts, running, waiting, 0.0, 0.0, False, health, received)


def test_external_work_is_the_surplus_over_this_routers_in_flight_priced_at_mean_cost() -> None:
    view = AgentLoadView(stale_after_s=1.0)
    b = Backend("a", "H100", ["m"])
    b.in_flight = 2
    view.record("a", report(100.0, 10.0, running=5, waiting=3))
    assert view.external_work(b, 10.5, mean_cost_s=0.4) == (8 - 2) * 0.4
    assert view.external_work(b, 11.01, mean_cost_s=0.4) == 0.0  # stale: ledger alone
    b.in_flight = 9
    assert view.external_work(b, 10.5, mean_cost_s=0.4) == 0.0  # never negative


def test_reports_are_ordered_by_sample_time_and_health_changes_are_flagged() -> None:
    view = AgentLoadView()
    assert view.record("a", report(100.0, 1.0)) is True
    assert view.record("a", report(100.2, 1.2, running=1)) is False
    assert view.record("a", report(99.0, 1.3, running=7)) is False  # older sample: ignored
    assert view.reports["a"].running == 1
    assert view.record("a", report(100.4, 1.4, health="draining")) is True
    assert view.age("a", 101.0) == 101.0 - 100.4


def test_update_counts_stale_agents_and_zeroes_their_external_work() -> None:
    view = AgentLoadView(stale_after_s=0.5)
    a, b = Backend("a", "H100", ["m"]), Backend("b", "H100", ["m"])
    view.record("a", report(0, 0.0, running=4))
    view.record("b", report(0, 0.9, running=4))
    stale = view.update([a, b], 1.0, lambda _backend: 0.1)
    assert stale == 1 and a.external == 0.0 and b.external == 4 * 0.1


def test_only_fresh_serving_reports_vouch_for_a_backend() -> None:
    view = AgentLoadView(stale_after_s=1.0)
    view.record("a", report(0, 10.0))
    view.record("b", report(0, 10.0, health="draining"))
    assert view.vouches("a", 10.5) and not view.vouches("a", 11.5)
    assert not view.vouches("b", 10.5) and not view.vouches("c", 10.5)


def test_agent_drain_takes_a_backend_out_and_only_the_agent_brings_it_back() -> None:
    from gpuroute.router.core.membership import follow_agent

    backends = BackendSet([Backend("a", "H100", ["m"]), Backend("b", "H100", ["m"])])
    a, b = backends.get("a"), backends.get("b")
    follow_agent(backends, a, "draining", 1.0)
    assert (a.state, a.reason) == (BackendState.DRAINING, "agent: draining")
    follow_agent(backends, a, "passing", 2.0)
    assert (a.state, a.reason) == (BackendState.WARMING, "agent: passing")
    backends.set_state(b, BackendState.DRAINING, 3.0, "consul: critical")
    follow_agent(backends, b, "passing", 4.0)
    assert b.state is BackendState.DRAINING  # Consul took it out: Consul brings it back
    backends.set_state(b, BackendState.EJECTED, 5.0, "breaker open")
    follow_agent(backends, b, "critical", 6.0)
    assert b.state is BackendState.EJECTED  # not routable anyway: left to health


def test_recovered_names_members_whose_checks_pass_again() -> None:
    before = {"a": member("a", "critical"), "b": member("b"), "c": member("c", "critical")}
    after = {"a": member("a"), "b": member("b"), "c": member("c", "critical"), "d": member("d")}
    assert recovered(before, after) == ["a"]  # not the steady, the still down, or the new
    assert recovered(after, {"a": member("a", "warning")}) == []  # warning: never down
    assert recovered({"x": member("x", "critical")}, {"x": member("x", "warning")}) == ["x"]


def test_meta_parallel_degrees_and_adapters_reach_the_backend() -> None:
    entries = [
        entry("tp4", gpu="H200", tensor_parallel="4", lora_adapters="m2,not-served"),
        entry("old", gpu="A100", gpu_count="2"),  # an agent before tensor_parallel in Meta
        entry("bad", tensor_parallel="0"),
        entry("nan", pipeline_parallel="two"),
    ]
    members, problems = members_from_entries(entries, (*GPUS, "H200"))
    assert sorted(members) == ["old", "tp4"]
    assert (members["tp4"].tp, members["tp4"].pp, members["tp4"].adapters) == (4, 1, ("m2",))
    assert (members["old"].tp, members["old"].adapters) == (2, ())
    assert any(p.startswith("bad: parallel degrees 0×1") for p in problems)
    assert any(p.startswith("nan: capacity, load_port or a parallel degree") for p in problems)
    backends = BackendSet()
    changes = plan(backends, set(), members)
    added = apply(backends, changes, members, 0.0, capacity_of=lambda m: 1.0, warm=False,
                  kind_of=lambda m: f"{m.gpu}-tp{m.tp}")  # fmt: skip
    by_id = {b.backend_id: b for b in added}
    assert (by_id["tp4"].gpu_type, by_id["tp4"].gpu, by_id["tp4"].gpus) == ("H200-tp4", "H200", 4)
    assert by_id["tp4"].lora_models == frozenset({"m2"})
