"""Which load reports may vouch for a Consul member, and for how long a vouched member
outlives its catalog entry (issue 42 finding 3): exact expectations on the pure checks."""

from __future__ import annotations

from gpuroute.router.core.agent_load import report_refusal
from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.membership import Member, apply, kept_by_agents, plan, removable

from gpuroute.load_auth import (
    MAX_SKEW_S,
    NONCE_BYTES,
    report_proof,
    watch_proof,
    watch_refusal,
)

TOKEN, NONCE = "s3cret-load-token", bytes(range(NONCE_BYTES))


def test_a_report_speaks_only_for_the_member_it_names() -> None:
    assert report_refusal("rogue", "real-agent", b"", None) == "other_backend"
    assert report_refusal("rogue", "", b"", None) == "other_backend"
    assert report_refusal("real-agent", "real-agent", b"", None) is None


def test_with_a_token_a_report_needs_the_agents_proof_for_this_stream() -> None:
    expected = report_proof(TOKEN, NONCE, "a")
    assert report_refusal("a", "a", expected, expected) is None
    assert report_refusal("a", "a", b"", expected) == "no_proof"
    assert report_refusal("a", "a", report_proof("other", NONCE, "a"), expected) == "no_proof"
    # a real agent's proof, relayed by a forged entry's server: bound to the other backend
    relayed = report_proof(TOKEN, NONCE, "real-agent")
    assert report_refusal("a", "a", relayed, expected) == "no_proof"
    other_nonce = report_proof(TOKEN, bytes(NONCE_BYTES), "a")  # another stream's proof
    assert report_refusal("a", "a", other_nonce, expected) == "no_proof"
    assert report_refusal("a", "b", expected, expected) == "other_backend"  # name first


def test_an_agent_takes_a_watch_only_with_a_fresh_proof_under_its_token() -> None:
    proof = watch_proof(TOKEN, NONCE, 1000.0, "router-1")
    assert watch_refusal(TOKEN, NONCE, 1000.0, "router-1", proof, 1000.0) is None
    assert watch_refusal(TOKEN, NONCE, 1000.0, "router-1", proof, 1000.0 + MAX_SKEW_S) is None
    assert watch_refusal(TOKEN, b"", 0.0, "router-1", b"", 1000.0) == (
        "no proof of the load-stream token"
    )
    assert watch_refusal(TOKEN, NONCE, 1000.0, "router-1", proof, 1061.0) == (
        "a proof more than 60 s away from the agent's clock"
    )
    assert watch_refusal(TOKEN, NONCE, 1000.0, "router-2", proof, 1000.0) == (
        "a proof under another load-stream token"
    )
    wrong = watch_proof("not-the-token", NONCE, 1000.0, "router-1")
    assert watch_refusal(TOKEN, NONCE, 1000.0, "router-1", wrong, 1000.0) == (
        "a proof under another load-stream token"
    )


def test_proofs_are_bound_to_every_part_and_never_the_token_itself() -> None:
    proofs = {
        report_proof(TOKEN, NONCE, "a"),
        report_proof(TOKEN, NONCE, "b"),
        report_proof(TOKEN, bytes(NONCE_BYTES), "a"),
        watch_proof(TOKEN, NONCE, 1.0, "a"),
        watch_proof(TOKEN, NONCE, 2.0, "a"),
    }
    assert len(proofs) == 5 and all(len(p) == 32 and TOKEN.encode() not in p for p in proofs)
    # length-prefixed parts: moving bytes between fields changes the proof
    assert report_proof(TOKEN, NONCE + b"a", "b") != report_proof(TOKEN, NONCE, "ab")


def test_agents_keep_a_missing_member_only_within_the_grace_after_consul_came_back() -> None:
    vouched = {"a", "b"}
    assert kept_by_agents(vouched, None, 100.0, 30.0) == frozenset()  # never came back
    assert kept_by_agents(vouched, 80.0, 100.0, 30.0) == frozenset({"a", "b"})
    assert kept_by_agents(vouched, 70.0, 100.0, 30.0) == frozenset({"a", "b"})  # edge: in
    assert kept_by_agents(vouched, 69.9, 100.0, 30.0) == frozenset()
    assert kept_by_agents(vouched, 80.0, 100.0, 0.0) == frozenset()
    assert kept_by_agents(vouched, 120.0, 100.0, 30.0) == frozenset()  # a clock that ran back


def member(sid: str) -> Member:
    return Member(sid, f"http://{sid}:8000", "H100", ("m",), "passing")


def test_a_deregistered_member_leaves_whatever_its_agent_says() -> None:
    """The attack's shape: `rogue` joined, its stream vouched (it named a real agent's), then
    Consul dropped it. Outside the grace it drains and goes; inside, it stays."""
    backends, managed = BackendSet(), set()
    joined = plan(backends, managed, {"rogue": member("rogue"), "a": member("a")})
    apply(backends, joined, {"rogue": member("rogue"), "a": member("a")}, 0.0,
          capacity_of=lambda m: 1.0, warm=False)  # fmt: skip
    managed |= {"rogue", "a"}
    members = {"a": member("a")}
    kept = kept_by_agents({"rogue", "a"}, back_at=0.0, now=100.0, grace_s=30.0)
    changes = plan(backends, managed, members, kept)
    assert changes.left == ["rogue"]
    apply(backends, changes, members, 100.0, capacity_of=lambda m: 1.0, warm=True)
    rogue = backends.get("rogue")
    assert (rogue.state, rogue.reason) == (BackendState.DRAINING, "consul: left")
    assert removable(backends, managed, members, kept) == ["rogue"]
    assert backends.get("a").state is BackendState.READY

    within = kept_by_agents({"rogue"}, back_at=90.0, now=100.0, grace_s=30.0)
    fresh = BackendSet([Backend("rogue", "H100", ["m"])])
    assert plan(fresh, {"rogue"}, {}, within).left == []
    assert removable(fresh, {"rogue"}, {}, within) == []
