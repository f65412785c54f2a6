"""What the latency model learns per GPU type, and how pessimistic lessons are forgotten
when no evidence comes to confirm them (router/core/latency_learning.py)."""

from __future__ import annotations

import math
import random

import pytest
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.latency_learning import Corrections
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies import DEFAULT_POLICY, build_policy
from gpuroute.router.core.slo import SloClass

PRIORS = engine_priors("llama-3.1-8b")
CHAT = SloClass("chat", ttft_s=1.0, tpot_s=0.1)


def taught(corrections: Corrections, overhead_s: float, until: float) -> None:
    """Alone first tokens of varied prompts, each `overhead_s` slower than predicted and
    twice as slow on the GPU, the last at `until`."""
    for i in range(200):
        gpu_s = 0.01 + 0.005 * (i % 50)
        corrections.learn_ttft("H100", gpu_s, overhead_s + 2 * gpu_s, True, until - 199 + i)


def test_a_pessimistic_lesson_holds_through_the_grace_then_returns_towards_the_prior() -> None:
    learned = Corrections(0.05, grace_s=10, memory_s=20)
    taught(learned, 0.5, until=100.0)
    ratio, overhead = learned.ttft_ratio["H100"], learned.overhead_s["H100"]
    assert ratio > 1.5 and overhead == pytest.approx(0.5, abs=0.05)
    learned.age(110.0)  # the grace: evidence 10 s old is still evidence
    assert (learned.ttft_ratio["H100"], learned.overhead_s["H100"]) == (ratio, overhead)
    learned.age(120.0)
    learned.age(130.0)  # in steps or at once: the same curve
    kept = math.exp(-1.0)
    assert learned.ttft_ratio["H100"] == pytest.approx(ratio**kept)
    assert learned.overhead_s["H100"] == pytest.approx(overhead * kept)


def test_an_optimistic_lesson_does_not_age() -> None:
    """A type that looks faster than its prior gets traffic, and its traffic corrects it."""
    learned = Corrections(0.05, grace_s=1, memory_s=1)
    for i in range(100):
        learned.learn_ttft("L4", 1.0, 0.25, False, float(i))
        learned.learn_tpot("L4", 0.6, float(i))
    ratio, tpot = learned.ttft_ratio["L4"], learned.tpot_ratio["L4"]
    assert ratio < 1 and tpot < 1
    learned.age(1000.0)
    assert (learned.ttft_ratio["L4"], learned.tpot_ratio["L4"]) == (ratio, tpot)


def test_fresh_evidence_stops_the_ageing() -> None:
    learned = Corrections(0.05, grace_s=10, memory_s=20)
    taught(learned, 0.5, until=100.0)
    learned.age(130.0)
    aged = learned.overhead_s["H100"]
    learned.learn_ttft("H100", 0.1, 0.9, False, 131.0)
    learned.age(140.0)  # within the grace of the new evidence
    assert learned.overhead_s["H100"] == aged


def test_the_overheads_fit_restarts_after_the_spell_it_came_from() -> None:
    """The old fit's points would snap the forgotten overhead back at the next first token."""
    learned = Corrections(0.05, grace_s=10, memory_s=20)
    taught(learned, 0.8, until=100.0)
    learned.age(200.0)
    aged = learned.overhead_s["H100"]
    assert aged < 0.01
    learned.learn_ttft("H100", 0.05, 0.1, True, 201.0)
    assert learned.overhead_s["H100"] == aged  # too few new points to fit: kept as aged


def test_a_type_with_requests_in_flight_keeps_its_lesson_and_idle_time_alone_counts() -> None:
    """A backend slowed mid-run holds its streams a long time: their verdicts are coming."""
    learned = Corrections(0.05, grace_s=10, memory_s=20)
    taught(learned, 0.5, until=100.0)
    overhead = learned.overhead_s["H100"]
    learned.age(200.0, busy={"H100"})
    assert learned.overhead_s["H100"] == overhead
    learned.age(220.0)  # idle from 200 s on
    assert learned.overhead_s["H100"] == pytest.approx(overhead * math.exp(-1.0))


def test_ageing_needs_a_grace_and_a_memory() -> None:
    with pytest.raises(ValueError, match="memory_s > 0"):
        Corrections(0.05, grace_s=1, memory_s=0)


# -- the scheduler: a fleet closed by an overload opens again --------------------------------
def overloaded_scheduler() -> Scheduler:
    """Two idle H100s whose model was taught, in an overload, that every first token comes
    a second late (the engines' own queues, which it cannot see)."""
    backends = BackendSet(
        Backend(f"h100-{i}", "H100", ("m",), capacity=PRIORS["H100"].capacity) for i in range(2)
    )
    estimator = CostEstimator({gpu: p.cost for gpu, p in PRIORS.items()})
    latency = LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})
    taught(latency.learned, 1.0, until=100.0)
    return Scheduler(backends, build_policy(DEFAULT_POLICY), estimator, latency=latency)


def chat(rid: int, at: float) -> RequestLifetime:
    return RequestLifetime(RequestInfo(rid, "m", 500, 64, slo=CHAT, arrived_at=at))


def first_admitted(sched: Scheduler, start: int, until: int) -> int | None:
    """A chat request each second, held back while predicted to miss (as SLO-aware
    admission does); the second the first one is admitted."""
    rng = random.Random(1)
    for now in range(start, until):
        decision = sched.route(chat(now, float(now)), float(now), rng, hold_misses=True)
        if decision is not None and decision.booked:
            return now
        sched.tick(float(now))
    return None


def test_a_fleet_closed_by_an_overload_is_tried_again_once_evidence_stops() -> None:
    """Nothing admitted means nothing learned: without ageing the idle H100s would be
    predicted to miss a 1 s TTFT for ever, and every request refused."""
    admitted = first_admitted(overloaded_scheduler(), 101, 200)
    # 5 s of grace after the last evidence (100 s), then a 10 s time constant
    assert admitted is not None and 105 < admitted < 140


def test_a_fleet_idle_for_want_of_traffic_keeps_its_lessons() -> None:
    """Nothing turned away, nothing forgotten: a lesson learned at noon still holds when
    traffic returns in the evening."""
    sched = overloaded_scheduler()
    assert sched.latency is not None
    overhead = sched.latency.overhead_s["H100"]
    for now in range(101, 1000):
        sched.tick(float(now))
    assert sched.latency.overhead_s["H100"] == overhead
    assert first_admitted(sched, 1000, 1001) is None


def test_a_fleet_with_a_request_in_flight_waits_for_its_verdict() -> None:
    sched = overloaded_scheduler()
    rng = random.Random(1)
    sent = sched.route(chat(1, 101.0), 101.0, rng)  # sent without holding: best effort
    assert sent is not None and sent.booked
    assert first_admitted(sched, 102, 200) is None


def test_without_ticks_the_lesson_stands() -> None:
    """The ageing is the scheduler's tick (the live router's and the simulator's), nothing
    hidden in a prediction."""
    sched = overloaded_scheduler()
    decision = sched.route(chat(1, 200.0), 200.0, random.Random(1), hold_misses=True)
    assert decision is not None and not decision.booked


# -- what teaches the fixed overhead ---------------------------------------------------------
def first_tokens_a_second_late(in_flight: int) -> LatencyModel:
    """Requests with no queue ahead in the model's view, each first token a second later
    than the GPU explains, on an H100 running `in_flight` requests (its batch limit: 256)."""
    model = LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})
    h100 = Backend("h", "H100", ("m",))
    h100.in_flight = in_flight
    for i in range(300):
        now = 10.0 * i  # far apart: nothing booked is still queued
        prompt = 100 + 50 * (i % 60)
        pred = model.predict(h100, prompt, prompt, 10, now)
        booking = model.book(h100, prompt, 10, now, pred)
        gpu_s = (pred.ttft_s - model.overhead_s.get("H100", 0.0)) / model.ttft_ratio.get("H100", 1)
        model.first_token(booking, now + 1.0 + gpu_s, 1.0 + gpu_s)
        model.finish(booking, None, in_flight)
    return model


def test_an_engine_with_little_in_flight_teaches_the_fixed_overhead() -> None:
    assert first_tokens_a_second_late(1).overhead_s["H100"] == pytest.approx(1.0, abs=0.05)
    assert first_tokens_a_second_late(32).overhead_s["H100"] == pytest.approx(1.0, abs=0.05)


def test_a_busy_engines_queue_is_not_taken_for_overhead() -> None:
    """A full batch's own queue, which the model cannot see, is not a fixed cost of every
    request: taken for one, it made idle engines look a second slow after an overload."""
    assert first_tokens_a_second_late(200).overhead_s.get("H100", 0.0) == 0.0
