"""SLO-aware scheduling core: classes, the latency model, the slo_aware policy, holding."""

from __future__ import annotations

import random

import pytest
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel, LatencyPrior, Prediction
from gpuroute.router.core.policies import DEFAULT_POLICY, build_policy
from gpuroute.router.core.scheduler import Outcome
from gpuroute.router.core.slo import DEFAULT_SLO_CLASSES, SloClass, SloClasses
from gpuroute.router.core.slo_admission import HoldQueue, MarginController
from gpuroute.router.priors import engine_priors
from hypothesis import given
from hypothesis import strategies as st

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams

PRIORS = engine_priors("llama-3.1-8b")
STANDARD = SloClass("standard", ttft_s=2.0, tpot_s=0.1)


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
def test_prediction_on_an_idle_backend_is_the_roofline_prefill_and_step() -> None:
    params = EngineParams(GPU_SPECS["A100"], MODELS["llama-3.1-8b"])
    prior = LatencyPrior.from_engine(params)
    model = LatencyModel({"A100": prior})
    pred = model.predict("a", "A100", 0, 2000, 2000, 100, now=0.0)
    step = prior.decode_step_s(1, 2000 + 50)
    assert pred.tpot_s == pytest.approx(step)
    compute = 2000 * params.prefill_compute_s_per_token(2000) + params.step_overhead_s
    assert pred.ttft_s == pytest.approx(max(step, compute))


def test_booked_prefill_queues_ahead_of_the_next_request_until_its_first_token() -> None:
    model = latency_model()
    first = model.predict("h", "H100", 0, 4000, 4000, 50, now=0.0)
    model.book(1, "h", "H100", 0, 4000, 4000, 50, 0.0, first)
    second = model.predict("h", "H100", 1, 100, 100, 50, now=0.0)
    alone = model.predict("other", "H100", 1, 100, 100, 50, now=0.0)
    assert second.ttft_s == pytest.approx(first.ttft_s + alone.ttft_s, rel=0.05)
    # the first token came early: the queue behind it moves up by as much
    model.first_token(1, first.ttft_s / 2, first.ttft_s / 2)
    after = model.predict("h", "H100", 1, 100, 100, 50, now=first.ttft_s / 2)
    assert after.ttft_s < second.ttft_s - first.ttft_s / 3


def test_corrections_do_not_compound_along_a_queue() -> None:
    """Each late first token moves the queue by its own error only (a bug once added every
    earlier error again, and the queue drained while the engine still had work)."""
    model = latency_model()
    now, bookings = 0.0, []
    for rid in range(5):
        pred = model.predict("h", "H100", rid, 2000, 2000, 10, now)
        model.book(rid, "h", "H100", rid, 2000, 2000, 10, now, pred)
        bookings.append(model._booked[rid].first_token_at)
    end = model._load["h"].prefill_until
    for rid, predicted in enumerate(bookings):
        model.first_token(rid, predicted + 0.1)  # every one 0.1 s late
    assert model._load["h"].prefill_until == pytest.approx(end + 0.1)


@given(st.lists(st.floats(0.2, 5.0), min_size=200, max_size=200))
def test_learned_ratio_stays_in_bounds_and_moves_towards_the_truth(samples) -> None:
    model = latency_model()
    for i, factor in enumerate(samples):
        pred = model.predict("l", "L4", 0, 500, 500, 10, float(i))
        model.book(i, "l", "L4", 0, 500, 500, 10, float(i), pred)
        model.first_token(i, float(i) + pred.ttft_s * factor, pred.ttft_s * factor)
        model.finish(i, None, 0)
    assert 0.125 <= model.ttft_ratio["L4"] <= 8.0


def test_ttft_ratio_converges_to_a_constant_slowdown() -> None:
    model = latency_model()
    for i in range(300):
        now = 10.0 * i  # far apart: no queueing
        pred = model.predict("l", "L4", 0, 500, 500, 10, now)
        model.book(i, "l", "L4", 0, 500, 500, 10, now, pred)
        truth = model.predict("x", "L4", 0, 500, 500, 10, now).ttft_s
        raw = truth / model.ttft_ratio.get("L4", 1.0)
        model.first_token(i, now + 2 * raw, 2 * raw)  # the engine runs at half speed
        model.finish(i, None, 0)
    assert model.ttft_ratio["L4"] == pytest.approx(2.0, rel=0.05)


# -- the policy ----------------------------------------------------------------------------
def test_a_long_prompt_goes_where_its_ttft_fits() -> None:
    sched = scheduler("L4", "L4", "L4", "H100")
    decision = sched.route(request(1, 12_000), 0.0, random.Random(1))
    assert decision is not None and decision.fits
    assert decision.backend.gpu_type == "H100"


def test_a_short_chat_may_fill_a_cheap_gpu_when_it_meets_its_slo() -> None:
    sched = scheduler("L4", "H100")
    h100 = sched.backends.get("h100-1")
    for i in range(40):  # the H100 has more than its share of the work already
        sched.ledger.start(f"busy-{i}", h100, 0.1)
    decision = sched.route(request(1, 200), 0.0, random.Random(1))
    assert decision is not None and decision.fits and decision.backend.gpu_type == "L4"


def test_a_predicted_miss_is_held_back_unbooked() -> None:
    tight = SloClass("tight", ttft_s=0.01, tpot_s=0.1)
    sched = scheduler("L4")
    decision = sched.route(request(1, 8000, tight), 0.0, random.Random(1), hold_misses=True)
    assert decision is not None and not decision.fits and not decision.booked
    assert len(sched.ledger) == 0 and sched.backends.get("l4-0").in_flight == 0
    sent = sched.route(request(1, 8000, tight), 0.0, random.Random(1))
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
    policy = sched.policy
    start = policy.control.margin
    decision = sched.route(request(1, 100), 0.0, random.Random(1))
    assert decision is not None
    sched.finish(1, "m", Outcome(True, 10, 100, met_slo=False), 1.0)
    assert policy.control.margin < start


# -- holding -------------------------------------------------------------------------------
def test_hold_queue_serves_the_most_important_class_first_and_expires_by_deadline() -> None:
    queue = HoldQueue(max_held=10)
    queue.hold("b1", 2, "batch", deadline=30.0, now=0.0)
    queue.hold("i1", 0, "interactive", deadline=0.5, now=0.0)
    queue.hold("s1", 1, "standard", deadline=2.0, now=0.0)
    assert list(queue.waiting()) == ["i1", "s1", "b1"]
    expired = queue.expire(1.0)
    assert [(r.item, r.reason) for r in expired] == [("i1", "slo_deadline")]
    assert list(queue.waiting()) == ["s1", "b1"]


def test_a_full_hold_queue_displaces_batch_work_never_an_interactive_request() -> None:
    queue = HoldQueue(max_held=2)
    queue.hold("b1", 2, "batch", 30.0, 0.0)
    queue.hold("b2", 2, "batch", 30.0, 0.0)
    refused = queue.hold("i1", 0, "interactive", 0.5, 0.0)
    assert [(r.item, r.reason) for r in refused] == [("b2", "slo_displaced")]
    refused = queue.hold("b3", 2, "batch", 30.0, 0.0)
    assert [(r.item, r.reason) for r in refused] == [("b3", "slo_queue_full")]
    assert "i1" in queue and len(queue) == 2


def test_a_request_past_its_budget_is_refused_at_once() -> None:
    refused = HoldQueue().hold("late", 1, "standard", deadline=1.0, now=1.5)
    assert refused[0].reason == "slo_deadline" and refused[0].slo_class == "standard"


def test_prediction_is_a_value() -> None:
    assert Prediction(1.0, 0.1) == Prediction(1.0, 0.1)
