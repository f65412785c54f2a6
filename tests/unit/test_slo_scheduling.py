"""SLO-aware scheduling core: classes, the latency model, the slo_aware policy, holding."""

from __future__ import annotations

import math
import random

import pytest
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.latency_prior import LatencyPrior
from gpuroute.router.core.policies import DEFAULT_POLICY, build_policy
from gpuroute.router.core.policies.stages import margin_key
from gpuroute.router.core.scheduler import Outcome
from gpuroute.router.core.slo import (
    DEFAULT_SLO_CLASSES,
    STANDARD,
    SloClass,
    SloClasses,
    time_per_output_token,
)
from gpuroute.router.core.slo_admission import HoldQueue, MarginController, TypeMargins
from gpuroute.router.observe.decision_log import DecisionLog
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import life

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams

PRIORS = engine_priors("llama-3.1-8b")
INTERACTIVE = next(c for c in DEFAULT_SLO_CLASSES if c.name == "interactive")


def latency_model() -> LatencyModel:
    return LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})


def scheduler(*gpus: str, policy: str = DEFAULT_POLICY) -> Scheduler:
    backends = BackendSet(
        Backend(f"{gpu.lower()}-{i}", gpu, ("m",), capacity=PRIORS[gpu].capacity)
        for i, gpu in enumerate(gpus)
    )
    estimator = CostEstimator({gpu: p.cost for gpu, p in PRIORS.items()})
    return Scheduler(backends, build_policy(policy), estimator, latency=latency_model())


def request(rid: int, prompt: int, slo: SloClass = STANDARD, at: float = 0.0) -> RequestInfo:
    return RequestInfo(rid, "m", prompt, 64, slo=slo, arrived_at=at)


# -- classes -------------------------------------------------------------------------------
def test_slo_class_met_counts_ttft_tpot_and_deadline() -> None:
    batch = SloClass("batch", ttft_s=10, tpot_s=0.5, e2e_s=60)
    assert batch.met(9.9, 0.4, 59)
    assert not batch.met(10.1, 0.4, 20)
    assert not batch.met(1, 0.6, 20)
    assert not batch.met(1, 0.1, 61)


def test_classes_rank_and_reject_unknown_names() -> None:
    classes = SloClasses(DEFAULT_SLO_CLASSES, "standard")
    assert classes.get(None).name == "standard"
    assert classes.rank["interactive"] < classes.rank["standard"] < classes.rank["batch"]
    with pytest.raises(ValueError, match="unknown SLO class 'gold'"):
        classes.get("gold")
    with pytest.raises(ValueError, match="default SLO class"):
        SloClasses(DEFAULT_SLO_CLASSES, "gold")


# -- latency model -------------------------------------------------------------------------
def engine(backend_id: str, gpu: str, in_flight: int = 0) -> Backend:
    backend = Backend(backend_id, gpu, ("m",))
    backend.in_flight = in_flight
    return backend


def test_prediction_on_an_idle_backend_is_the_roofline_prefill_and_step() -> None:
    params = EngineParams(GPU_SPECS["A100"], MODELS["llama-3.1-8b"])
    prior = LatencyPrior.from_engine(params)
    model = LatencyModel({"A100": prior})
    pred = model.predict(engine("a", "A100"), 2000, 2000, 100, now=0.0)
    step = prior.decode_step_s(1, 2000 + 50)
    assert pred.tpot_s == pytest.approx(step)
    compute = 2000 * params.prefill_compute_s_per_token(2000) + params.step_overhead_s
    assert pred.ttft_s == pytest.approx(max(step, compute))


def test_scaled_priors_predict_that_many_times_slower() -> None:
    prior = PRIORS["L4"].latency
    fast = LatencyModel({"L4": prior}).predict(engine("l", "L4", 3), 1500, 1500, 80, now=0.0)
    slow = LatencyModel({"L4": prior.scaled(3.0)}).predict(
        engine("l", "L4", 3), 1500, 1500, 80, now=0.0
    )
    assert slow.ttft_s == pytest.approx(3 * fast.ttft_s)
    assert slow.tpot_s == pytest.approx(3 * fast.tpot_s)
    assert prior.scaled(3.0).max_num_seqs == prior.max_num_seqs  # limits are not times
    assert prior.scaled(1.0) is prior


def test_a_gray_failing_backend_predicts_its_own_compute_that_many_times_slower() -> None:
    """Slowness is the backend's own (its GPU type's ratio is shared and bounded): on an idle
    backend everything predicted is its compute, so all of it stretches."""
    model = latency_model()
    healthy = model.predict(engine("a", "A100"), 1500, 1500, 80, now=0.0)
    sick_engine = engine("b", "A100")
    sick_engine.slowness = 4.0
    sick = model.predict(sick_engine, 1500, 1500, 80, now=0.0)
    assert sick.ttft_s == pytest.approx(4 * healthy.ttft_s)
    assert sick.tpot_s == pytest.approx(4 * healthy.tpot_s)
    assert sick.prefill_s == pytest.approx(4 * healthy.prefill_s)
    # what its prefill does to the streams there is booked at the type's speed: the
    # slowness tracker expects that much interference and must not excuse the slowness
    assert sick.interference_s == pytest.approx(healthy.interference_s)


def test_other_routers_work_waits_ahead() -> None:
    model = latency_model()
    busy = engine("h", "H100")
    alone = model.predict(busy, 100, 100, 50, now=0.0).ttft_s
    busy.external = 3.0  # the agent reports 3 s of work this router did not send
    assert model.predict(busy, 100, 100, 50, now=0.0).ttft_s == pytest.approx(alone + 3.0)


def test_booked_prefill_queues_ahead_of_the_next_request_until_its_first_token() -> None:
    model = latency_model()
    h100 = engine("h", "H100")
    first = model.predict(h100, 4000, 4000, 50, now=0.0)
    booking = model.book(h100, 4000, 50, 0.0, first)
    h100.in_flight = 1
    second = model.predict(h100, 100, 100, 50, now=0.0)
    alone = model.predict(engine("other", "H100", 1), 100, 100, 50, now=0.0)
    assert second.ttft_s == pytest.approx(first.ttft_s + alone.ttft_s, rel=0.05)
    # the first token came early: the queue behind it moves up by as much
    model.first_token(booking, first.ttft_s / 2, first.ttft_s / 2)
    after = model.predict(h100, 100, 100, 50, now=first.ttft_s / 2)
    assert after.ttft_s < second.ttft_s - first.ttft_s / 3


def queue_of_five(late_s: float) -> float:
    """Five requests queued on one H100, each first token `late_s` after its prediction:
    the TTFT then predicted for one more (its own prefill included)."""
    model = latency_model()
    h100 = engine("h", "H100")
    predicted, bookings = [], []
    for _ in range(5):
        pred = model.predict(h100, 2000, 2000, 10, 0.0)
        bookings.append(model.book(h100, 2000, 10, 0.0, pred))
        predicted.append(pred.ttft_s)
    for booking, at in zip(bookings, predicted, strict=True):
        model.first_token(booking, at + late_s)
    return model.predict(h100, 2000, 2000, 10, predicted[-1] + late_s).ttft_s


def test_corrections_do_not_compound_along_a_queue() -> None:
    """Each late first token moves the queue by its own error only (a bug once added every
    earlier error again, and the queue drained while the engine still had work)."""
    on_time, late = queue_of_five(0.0), queue_of_five(0.1)
    assert late == pytest.approx(on_time)  # the last one came at the queue's end, 0.1 s late


@given(st.lists(st.floats(0.2, 5.0), min_size=200, max_size=200))
def test_learned_ratio_stays_in_bounds(samples) -> None:
    model = latency_model()
    l4 = engine("l", "L4")
    for i, factor in enumerate(samples):
        pred = model.predict(l4, 500, 500, 10, float(i))
        booking = model.book(l4, 500, 10, float(i), pred)
        model.first_token(booking, float(i) + pred.ttft_s * factor, pred.ttft_s * factor)
        model.finish(booking, None, 0)
    assert 0.125 <= model.ttft_ratio["L4"] <= 8.0


def test_ttft_ratio_converges_to_a_constant_slowdown() -> None:
    model = latency_model()
    l4 = engine("l", "L4")
    for i in range(300):
        now = 10.0 * i  # far apart: no queueing
        pred = model.predict(l4, 500, 500, 10, now)
        booking = model.book(l4, 500, 10, now, pred)
        raw = pred.ttft_s / model.ttft_ratio.get("L4", 1.0)
        model.first_token(booking, now + 2 * raw, 2 * raw)  # the engine runs at half speed
        model.finish(booking, None, 0)
    assert model.ttft_ratio["L4"] == pytest.approx(2.0, rel=0.05)


def replay_first_tokens(model: LatencyModel, observe, n: int = 3000) -> None:
    """Idle H100s and L4s, prompts of 100 to 8,000 tokens; `observe(gpu_seconds)` gives the
    measured TTFT of a request whose true GPU time is its roofline prediction."""
    rng = random.Random(7)
    for i in range(n):
        backend = engine(f"b{i % 2}", ("H100", "L4")[i % 2])
        now = 10.0 * i  # far apart: no queueing
        prompt = rng.randrange(100, 8000)
        pred = model.predict(backend, prompt, prompt, 10, now)
        ratio = model.ttft_ratio.get(backend.gpu_type, 1.0)
        truth = (pred.ttft_s - model.overhead_s.get(backend.gpu_type, 0.0)) / ratio
        booking = model.book(backend, prompt, 10, now, pred)
        ttft = observe(truth, rng)
        model.first_token(booking, now + ttft, ttft)
        model.finish(booking, None, 0)


def test_a_fixed_overhead_is_learned_apart_from_the_gpus_speed() -> None:
    """50 ms of HTTP hops on every request, GPUs 1.5x slower than the roofline: the hops
    go to the overhead, not into the ratios (where they would make the H100, whose
    prefills are shortest, look the slowest)."""
    model = latency_model()
    replay_first_tokens(model, lambda gpu_s, rng: 0.05 + 1.5 * gpu_s * rng.uniform(0.9, 1.1))
    assert model.overhead_s["H100"] == pytest.approx(0.05, abs=0.02)
    assert model.overhead_s["L4"] == pytest.approx(0.05, abs=0.02)
    assert model.ttft_ratio["H100"] == pytest.approx(1.5, rel=0.15)
    assert model.ttft_ratio["L4"] == pytest.approx(1.5, rel=0.15)


def test_no_overhead_is_invented_where_the_gpu_explains_the_ttft() -> None:
    model = latency_model()
    replay_first_tokens(model, lambda gpu_s, rng: gpu_s * rng.uniform(0.95, 1.05))
    assert max(model.overhead_s.values()) <= 0.01
    assert model.ttft_ratio["L4"] == pytest.approx(1.0, rel=0.1)


# -- the policy ----------------------------------------------------------------------------
def test_a_long_prompt_goes_where_its_ttft_fits() -> None:
    sched = scheduler("L4", "L4", "L4", "H100")
    decision = sched.route(life(request(1, 12_000)), 0.0, random.Random(1))
    assert decision is not None and decision.fits
    assert decision.backend.gpu_type == "H100"


def test_a_short_chat_goes_to_a_small_gpu_while_the_fast_one_has_a_queue() -> None:
    sched = scheduler("L4", "H100")
    queued = [life(request(i, 6000)) for i in range(4)]
    for prompt in queued:  # 24,000 tokens of prefill on the H100 (the L4 cannot fit them)
        decision = sched.route(prompt, 0.0, random.Random(1))
        assert decision is not None and decision.backend.gpu_type == "H100"
    decision = sched.route(life(request(9, 200)), 0.0, random.Random(1))
    assert decision is not None and decision.fits and decision.backend.gpu_type == "L4"
    # with the queue gone (first tokens in, as predicted), the H100 is the faster start
    for prompt in queued:
        sched.first_token(prompt, 2.0, None)
    decision = sched.route(life(request(10, 200)), 2.0, random.Random(1))
    assert decision is not None and decision.backend.gpu_type == "H100"


def test_a_long_prompt_stays_off_the_backend_full_of_streams_a_short_one_joins_them() -> None:
    """Two A100s: one runs eight streams, the other none but has a little prefill queued.
    An 8,000-token prompt's chunks would stretch every step of the eight streams, so it
    takes the queue; a 100-token prompt stalls nobody and starts sooner among the streams."""
    sched = scheduler("A100", "A100")
    busy, queued = sched.backends.get("a100-0"), sched.backends.get("a100-1")
    busy.in_flight = 8
    first = sched.route(life(request(1, 600), tried=["a100-0"]), 0.0, random.Random(1))
    assert first is not None and first.backend is queued
    long_prompt = sched.route(life(request(2, 8000)), 0.0, random.Random(1))
    assert long_prompt is not None and long_prompt.backend is queued
    short_prompt = sched.route(life(request(3, 100)), 0.0, random.Random(1))
    assert short_prompt is not None and short_prompt.backend is busy


@pytest.mark.parametrize(("slowness", "expected"), [(1.0, "h100-0"), (12.0, "l4-1")])
def test_a_gray_failing_gpu_is_not_promised_a_pace_it_cannot_keep(slowness, expected) -> None:
    """An H100 running 12x slow decodes at ~56 ms a token: an interactive stream (50 ms)
    fits the healthy L4, not it. Before slowness stretched the prediction, the filter saw
    the H100's 4.7 ms and promised it the stream (the live fault bench: a 10x slow H100
    kept most of the picks)."""
    sched = scheduler("H100", "L4")
    sched.backends.get("h100-0").slowness = slowness
    decision = sched.route(life(request(1, 200, slo=INTERACTIVE)), 0.0, random.Random(1))
    assert decision is not None and decision.fits
    assert decision.backend.backend_id == expected
    assert decision.prediction.tpot_s <= INTERACTIVE.tpot_s


def test_a_predicted_miss_is_held_back_unbooked() -> None:
    tight = SloClass("tight", ttft_s=0.01, tpot_s=0.1)
    sched = scheduler("L4")
    decision = sched.route(life(request(1, 8000, tight)), 0.0, random.Random(1), hold_misses=True)
    assert decision is not None and not decision.fits and not decision.booked
    assert len(sched.ledger) == 0 and sched.backends.get("l4-0").in_flight == 0
    sent = sched.route(life(request(1, 8000, tight)), 0.0, random.Random(1))
    assert sent is not None and sent.booked and not sent.fits  # without holding: best effort


def test_met_verdicts_tighten_and_loosen_the_margin() -> None:
    control = MarginController(0.9, target=0.9, step=0.05)
    for _ in range(5):
        control.observe(False)
    tightened = control.margin
    assert tightened < 0.9
    for _ in range(200):
        control.observe(True)
    assert control.margin == 1.0 > tightened


def test_scheduler_feeds_slo_verdicts_to_the_policy() -> None:
    sched = scheduler("H100")
    margins = sched.policy.fit.margins
    key = margin_key("H100", STANDARD.name)  # a GPU type's margin for one class
    start = margins.of(key, 0.0)
    served_one = life(request(1, 100))
    decision = sched.route(served_one, 0.0, random.Random(1))
    assert decision is not None
    sched.finish(served_one, Outcome(True, 10, 100, met_slo=False), 0.0)
    assert margins.of(key, 0.0) == pytest.approx(start - 0.01 * 0.95)
    assert margins.of(margin_key("H100", "interactive"), 0.0) == start  # its own margin


def test_one_gpu_types_misses_leave_the_others_margin_alone() -> None:
    margins = TypeMargins(0.9, target=0.95)
    for _ in range(50):
        margins.observe("L4", False, 0.0)
    assert margins.of("L4", 0.0) == pytest.approx(0.9 - 50 * 0.01 * 0.95)
    assert margins.of("H100", 0.0) == 0.9
    margins.observe("H100", True, 0.0)
    assert margins.of("H100", 0.0) == pytest.approx(0.9 + 0.01 * 0.05)


def test_a_gpu_types_margin_returns_towards_the_start_without_verdicts() -> None:
    margins = TypeMargins(0.9, target=0.95, memory_s=100.0)
    for _ in range(40):
        margins.observe("L4", False, 10.0)
    closed = margins.of("L4", 10.0)
    assert closed == pytest.approx(0.9 - 0.38)
    assert margins.of("L4", 110.0) == pytest.approx(0.9 - 0.38 * math.exp(-1))
    assert margins.of("L4", 10_000.0) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="memory_s"):
        TypeMargins(0.9, memory_s=0)


def served(sched: Scheduler, rid: int, info: RequestInfo, met: bool) -> None:
    """Route `info` and finish it at once with the verdict `met`."""
    request_life = life(info)
    decision = sched.route(request_life, 0.0, random.Random(rid))
    assert decision is not None and decision.booked and decision.fits
    sched.finish(request_life, Outcome(True, 10, 100, met_slo=met), 0.0)


# A class in which the prompt below needs about 0.6 of its SLO on an idle H100 (the TPOT
# dominates), and one in which it needs about 0.85; the standard class needs about 0.05.
NEEDS_0_6 = SloClass("needs-0.6", ttft_s=2.0, tpot_s=0.008)
NEEDS_0_85 = SloClass("needs-0.85", ttft_s=2.0, tpot_s=0.0055)


def test_the_margins_needed_by_the_test_classes() -> None:
    sched = scheduler("H100")
    (h100,) = sched.backends
    for slo, low, high in ((NEEDS_0_6, 0.5, 0.7), (NEEDS_0_85, 0.8, 0.9), (STANDARD, 0, 0.1)):
        share = sched.policy.score(sched.context(request(1, 100, slo), 0.0, random.Random(0)), h100)
        assert low < share < high


def test_a_miss_admitted_under_a_looser_margin_does_not_tighten_it_further() -> None:
    """Verdicts come a request's duration after admission: in a burst the backlog admitted
    under the margin of before misses all at once, and counting those misses again drove
    the margin to its floor and refused what the tightened margin would serve in time."""
    sched = scheduler("H100")
    (h100,) = sched.backends
    margins = sched.policy.fit.margins
    key = margin_key("H100", NEEDS_0_6.name)
    early = life(request(1, 100, NEEDS_0_6))
    admitted_early = sched.route(early, 0.0, random.Random(1))
    assert admitted_early is not None and admitted_early.fits
    for _ in range(40):  # misses of its class that needed little: the margin passes 0.6
        sched.policy.observe_slo(0.1, False, h100, 0.0, NEEDS_0_6.name)
    tightened = margins.of(key, 0.0)
    assert tightened == pytest.approx(0.9 - 40 * 0.01 * 0.95)
    sched.finish(early, Outcome(True, 10, 100, met_slo=False), 0.0)
    assert margins.of(key, 0.0) == tightened
    sched.policy.observe_slo(0.5, False, h100, 0.0, NEEDS_0_6.name)  # one it still admits
    assert margins.of(key, 0.0) == pytest.approx(tightened - 0.01 * 0.95)


def test_hits_far_inside_the_margin_do_not_loosen_it() -> None:
    """A calm spell says nothing about requests near the bound: its hits used to wind the
    margin up to its ceiling, and the next burst was admitted at predictions beyond the
    SLO, missed, and closed the margin to its floor."""
    sched = scheduler("H100")
    margins = sched.policy.fit.margins
    for rid in range(1, 21):
        served(sched, rid, request(rid, 100), met=True)
    assert margins.of(margin_key("H100", STANDARD.name), 0.0) == 0.9
    served(sched, 21, request(21, 100, NEEDS_0_85), met=True)
    assert margins.of(margin_key("H100", NEEDS_0_85.name), 0.0) == pytest.approx(0.9 + 0.01 * 0.05)


def test_slow_gpus_missing_their_slo_do_not_close_the_fast_ones() -> None:
    """Streams stalled on L4s tighten the L4s' margin only: a prompt the H100 is predicted
    to serve at 0.6 of its SLO still fits there (one fleet-wide margin, pulled to its floor
    by the L4s' misses, refused it)."""
    sched = scheduler("H100", "L4")
    h100 = next(b for b in sched.backends if b.gpu_type == "H100")
    l4 = next(b for b in sched.backends if b.gpu_type == "L4")
    for rid in range(1, 101):
        on_l4 = life(request(rid, 100), tried=[h100.backend_id])
        decision = sched.route(on_l4, 0.0, random.Random(rid))
        assert decision is not None and decision.backend is l4
        sched.finish(on_l4, Outcome(True, 10, 100, met_slo=False), 0.0)
    assert sched.policy.fit.margins.of(margin_key("L4", STANDARD.name), 0.0) == pytest.approx(0.3)
    tight = SloClass("tight", ttft_s=2.0, tpot_s=0.008)
    info = request(1000, 100, tight)
    share = sched.policy.score(sched.context(info, 0.0, random.Random(0)), h100)
    assert 0.3 < share < 0.9  # within the start margin, outside the floor the L4s reached
    decision = sched.route(life(info), 0.0, random.Random(0))
    assert decision is not None and decision.backend is h100 and decision.fits


# -- holding -------------------------------------------------------------------------------
CLASSES = SloClasses(DEFAULT_SLO_CLASSES, "standard")
INTERACTIVE, _, BATCH = DEFAULT_SLO_CLASSES  # TTFT 0.5 s and 60 s


def test_hold_queue_serves_the_most_important_class_first_and_expires_by_deadline() -> None:
    queue = HoldQueue(CLASSES, max_held=10)
    queue.hold("b1", BATCH, arrived_at=0.0, now=0.0)
    queue.hold("i1", INTERACTIVE, arrived_at=0.0, now=0.0)
    queue.hold("s1", STANDARD, arrived_at=0.0, now=0.0)
    assert queue.peek() == ["i1", "s1", "b1"]
    assert queue.peek(limit=2) == ["i1", "s1"]
    assert queue.deadline("i1") == 0.5 and queue.deadline("gone") is None
    expired = queue.expire(1.0)
    assert [(r.item, r.reason, r.priority) for r in expired] == [("i1", "deadline", "interactive")]
    assert queue.peek() == ["s1", "b1"]


def test_a_full_hold_queue_displaces_batch_work_never_an_interactive_request() -> None:
    queue = HoldQueue(CLASSES, max_held=2)
    queue.hold("b1", BATCH, 0.0, 0.0)
    queue.hold("b2", BATCH, 0.0, 0.0)
    refused = queue.hold("i1", INTERACTIVE, 0.0, 0.0)
    assert [(r.item, r.reason, r.priority) for r in refused] == [("b2", "displaced", "batch")]
    refused = queue.hold("b3", BATCH, 0.0, 0.0)
    assert [(r.item, r.reason, r.priority) for r in refused] == [("b3", "queue_full", "batch")]
    assert "i1" in queue and len(queue) == 2


def test_a_request_past_its_budget_is_refused_at_once() -> None:
    refused = HoldQueue(CLASSES).hold("late", STANDARD, arrived_at=0.0, now=2.5)
    assert refused[0].reason == "deadline" and refused[0].priority == "standard"


def test_tpot_counts_the_tokens_after_the_first() -> None:
    assert time_per_output_token(1.0, 3.0, 5) == 0.5
    assert time_per_output_token(1.0, 3.0, 1) is None
    assert STANDARD.met(1.0, None, 1.0)  # a one-token answer has no TPOT to miss


def test_decision_log_names_the_class_and_what_was_predicted() -> None:
    sched, lines = scheduler("H100", "L4"), []
    log = DecisionLog(1.0, DEFAULT_POLICY, emit=lines.append)
    info = request(1, 3000)
    decision = sched.route(life(info), 0.0, random.Random(1), trace=log.trace())
    assert decision is not None and decision.prediction is not None
    log.decision(info, decision, 0, emit=log.wants_next())
    event = lines[0]
    assert event["slo_class"] == "standard" and event["fits_slo"] is True
    assert event["predicted_ttft_s"] == round(decision.prediction.ttft_s, 4) > 0
    assert event["predicted_tpot_s"] == round(decision.prediction.tpot_s, 5) > 0


def test_the_margin_a_request_needed_lives_and_ends_with_its_lifetime() -> None:
    """What a request needed to be placed waits for its verdict on its lifetime, not in a
    table in the policy (one that had to be capped, because failed and cancelled requests
    never sent their verdict)."""
    sched = scheduler("H100")
    placed = [life(request(rid, 100)) for rid in range(1, 6)]
    for request_life in placed:
        decision = sched.route(request_life, 0.0, random.Random(request_life.request_id))
        assert decision is not None and decision.fits
        assert 0 < request_life.needed < 0.9
    for request_life in placed:
        sched.release(request_life)  # ended without a verdict
        assert request_life.needed is None and request_life.work is None
    assert not hasattr(sched.policy, "_needed") and len(sched.ledger) == 0


def test_why_an_l4_was_chosen_over_the_h100_is_one_log_entry() -> None:
    """An H100 busy with long prompts is predicted to miss a short request's TTFT: the
    entry shows its predicted TTFT over the bound, the L4 fitting with its score terms
    (which add up to the score it was ranked by), and the margin the L4 needed."""
    sched = scheduler("H100", "L4")
    for i in range(40):  # long prompts queued on the H100 (the L4 excluded for them)
        busy = life(request(100 + i, 16_000), tried=["l4-1"])
        assert sched.route(busy, 0.0, random.Random(i)) is not None
    lines: list[str] = []
    log = DecisionLog(1.0, DEFAULT_POLICY, emit=lines.append)
    info = request(1, 200)
    decision = sched.route(life(info), 0.0, random.Random(1), trace=log.trace())
    assert decision is not None and decision.backend.backend_id == "l4-1"
    log.decision(info, decision, 0, emit=True)
    (event,) = log.explain("1")
    assert lines[0] == event
    rows = {row["backend"]: row for row in event["candidates"]}
    h100, l4 = rows["h100-0"], rows["l4-1"]
    bound = STANDARD.ttft_s * h100["margin"]
    assert h100["filter"].startswith("dropped: predicted TTFT ")
    assert h100["filter"].endswith(f" s > bound {bound:.3f} s")
    assert h100["predicted_ttft_s"] > bound and "score" not in h100
    assert l4["filter"] == "fits" and l4["predicted_ttft_s"] <= STANDARD.ttft_s * l4["margin"]
    terms = l4["score"]
    assert set(terms) == {"ttft_share", "stall_share", "cost", "total"}
    assert terms["total"] == pytest.approx(
        terms["ttft_share"] + terms["stall_share"] + terms["cost"], abs=2e-4
    )
    assert (event["chosen_gpu"], event["fits_slo"], event["reason"]) == ("L4", True, "policy")
    needed = max(l4["predicted_ttft_s"] / STANDARD.ttft_s, l4["predicted_tpot_s"] / STANDARD.tpot_s)
    assert event["margin_needed"] == pytest.approx(needed, abs=1e-3)
