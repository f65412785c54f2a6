"""The decision log explains a pick as the scheduler saw it (before booking), stage by stage;
samples with its own RNG (so turning it on changes no pick); says why a backend was chosen;
and keeps the recent requests' events for `gpuroute explain` with sampling off."""

from __future__ import annotations

import random

from gpuroute.router.core import BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.policies import build_policy
from gpuroute.router.core.policies.base import PickTrace
from gpuroute.router.core.scheduler import Outcome, PickReason
from gpuroute.router.observe.decision_log import DecisionLog
from support.helpers import PRIORS, backends, life


def scheduler(policy: str = "least_outstanding_work", n: int = 4) -> Scheduler:
    pool = backends(2, "H100") + backends(n - 2, "L4")
    for i, b in enumerate(pool):
        b.backend_id = f"b{i}"
    return Scheduler(BackendSet(pool), build_policy(policy), CostEstimator(PRIORS))


def replay(policy: str, sample: float, seed: int = 7) -> tuple[list[str], list[dict]]:
    """Route 300 requests (finishing every third) with the log at `sample`."""
    sched, rng, lines = scheduler(policy), random.Random(seed), []
    log = DecisionLog(sample, policy, rng=random.Random(99), emit=lines.append)
    picks = []
    for i in range(300):
        info = RequestInfo(i, "m", 50 + (i * 37) % 900, 20, prefix_blocks=(i % 5, i % 7))
        request = life(info)
        emit = log.wants_next()
        decision = sched.route(request, i * 0.01, rng, trace=log.trace(emit) if emit else None)
        assert decision is not None
        log.decision(info, decision, 0, emit=emit)
        picks.append(decision.backend.backend_id)
        if i % 3 == 0:
            sched.finish(request, Outcome(True, 20, info.prompt_tokens), i * 0.01)
    return picks, lines


def test_turning_the_log_on_changes_no_pick() -> None:
    for policy in ("least_outstanding_work", "p2c", "random", "prefix_affinity"):
        off, none = replay(policy, 0.0)
        on, logged = replay(policy, 1.0)
        assert off == on, policy
        assert none == [] and len(logged) == 300


def test_sampling_logs_about_the_sampled_share() -> None:
    _, logged = replay("least_outstanding_work", 0.25)
    assert 45 <= len(logged) <= 105  # 75 expected; binomial sd 7.5, so ±4 sd


def test_scores_are_those_before_booking() -> None:
    """On an idle fleet, least outstanding work scores each backend by this request's cost
    alone; a log written after booking would show the chosen backend at twice its cost."""
    sched, lines = scheduler(), []
    log = DecisionLog(1.0, "least_outstanding_work", emit=lines.append)
    info = RequestInfo("r1", "m", 1000, 100)
    decision = sched.route(life(info), 0.0, random.Random(1), trace=log.trace())
    log.decision(info, decision, 0, emit=log.wants_next())
    event = lines[0]
    scores = {c["backend"]: c["score"] for c in event["candidates"]}
    h100_cost = PRIORS["H100"].seconds(1000, 100)
    assert scores == {
        "b0": h100_cost,
        "b1": h100_cost,
        "b2": PRIORS["L4"].seconds(1000, 100),
        "b3": PRIORS["L4"].seconds(1000, 100),
    }
    assert event["chosen"] in ("b0", "b1") and decision.cost_s == h100_cost
    assert sched.backends.get(event["chosen"]).outstanding == h100_cost  # booked once


def test_reason_says_probe_session_or_policy() -> None:
    sched, rng = scheduler(), random.Random(3)
    first = sched.route(life(RequestInfo("a", "m", 10, 10)), 0.0, rng, trace=PickTrace())
    assert first.reason is PickReason.POLICY
    remembered = sched.route(
        life(RequestInfo("b", "m", 10, 10)), 0.0, rng, prefer="b3", trace=PickTrace()
    )
    assert (remembered.backend.backend_id, remembered.reason) == ("b3", PickReason.SESSION)
    bad = sched.backends.get("b1")
    for t in range(5):
        sched.health.record(bad, False, float(t))
    sched.tick(30.0)  # cooldown over: half-open, wanting one probe
    request = life(RequestInfo("c", "m", 10, 10))
    probe = sched.route(request, 30.1, rng, prefer="b3", trace=PickTrace())
    assert (probe.backend.backend_id, probe.reason) == ("b1", PickReason.PROBE)


def test_event_fields_and_failures() -> None:
    lines: list[str] = []
    log = DecisionLog(1.0, "p2c", emit=lines.append, wall_clock=lambda: 12.5)
    sched = scheduler("p2c")
    info = RequestInfo("r9", "m", 64, 8)
    decision = sched.route(life(info), 0.0, random.Random(1), trace=log.trace(sampled=True))
    log.decision(info, decision, 1, emit=True)
    log.failure(info, decision.backend, "refused", emit=True)
    event, failure = lines
    assert event["request_id"] == "r9" and event["attempt"] == 1 and event["ts"] == 12.5
    assert event["reason"] == "policy" and event["policy"] == "p2c"
    assert event["candidates_n"] == 4 and len(event["candidates"]) == 4
    assert failure == {
        "event": "attempt_failed", "ts": 12.5, "request_id": "r9", "policy": "p2c",
        "tenant": None, "model": "m", "prompt_tokens": 64, "slo_class": None,
        "backend": decision.backend.backend_id, "kind": "refused",
    }  # fmt: skip
    assert log.explain("r9") == [event, failure]  # kept for `gpuroute explain` too


def test_an_unsampled_decision_is_kept_but_not_written() -> None:
    """Sampling off: nothing is written, yet the recent requests can still be explained."""
    lines: list[str] = []
    log = DecisionLog(0.0, "p2c", emit=lines.append, keep=3)
    sched = scheduler("p2c")
    for rid in ("r1", "r2", "r3", "r4"):
        info = RequestInfo(rid, "m", 64, 8)
        decision = sched.route(life(info), 0.0, random.Random(1), trace=log.trace())
        log.decision(info, decision, 0, emit=log.wants_next())
        log.failure(info, decision.backend, "5xx", emit=False) if rid == "r4" else None
    assert lines == []
    assert log.explain("r1") == [] and log.explain("r2") == []  # only the last 3 events kept
    (r3,) = log.explain("r3")
    assert r3["event"] == "decision" and r3["candidates_n"] == 4
    assert [e["event"] for e in log.explain("r4")] == ["decision", "attempt_failed"]


def test_nothing_is_traced_when_nothing_is_kept_or_sampled() -> None:
    assert DecisionLog(0.0, "p2c", keep=0).trace() is None
    assert DecisionLog(0.5, "p2c", keep=0).trace() is None  # this request was not sampled
    assert DecisionLog(0.5, "p2c", keep=0).trace(sampled=True).full  # this one was
    decision = scheduler("p2c").route(life(RequestInfo("r", "m", 64, 8)), 0.0, random.Random(1))
    assert decision is not None and decision.trace is None


def test_an_unsampled_trace_scores_no_candidate_for_a_policy_that_does_not_itself() -> None:
    """Kept for `gpuroute explain` but not sampled, a pick costs no per-candidate work:
    p2c's trace has no rows and names only the backends tried before."""
    sched = scheduler("p2c")
    request = life(RequestInfo("r", "m", 64, 8), tried=["b0"])
    trace = PickTrace()
    assert sched.route(request, 0.0, random.Random(1), trace=trace) is not None
    assert trace.rows == {} and trace.candidates == 3
    assert trace.excluded == {"b0": "tried by an earlier attempt"}
