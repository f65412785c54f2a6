"""The stall guard: a long prompt's prefill is not placed where it would push a protected
stream (one whose output length is known) past its TPOT."""

from __future__ import annotations

import math
import random

import pytest
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies import DEFAULT_POLICY, build_policy
from gpuroute.router.core.slo import STANDARD

PRIORS = engine_priors("llama-3.1-8b")


def latency_model() -> LatencyModel:
    return LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})


def l4(name: str = "l4-0") -> Backend:
    return Backend(name, "L4", ("m",), capacity=PRIORS["L4"].capacity)


def book(model: LatencyModel, backend: Backend, prompt: int, output: int, bound=None):
    """(its prediction, its booking)"""
    predicted = model.predict(backend, prompt, prompt, output, 0.0)
    booking = model.book(backend, prompt, output, 0.0, predicted, bound)
    backend.in_flight += 1
    return predicted, booking


def test_a_protected_stream_takes_its_tokens_slack_in_later_prefill() -> None:
    model, backend = latency_model(), l4()
    stream, short = book(model, backend, 100, 11, bound=0.15)
    allowance = 10 * (0.15 - stream.tpot_s)
    assert model.stall_allowance("l4-0") == pytest.approx(allowance)
    long_prompt, _ = book(model, backend, 6000, 64)
    assert long_prompt.interference_s > 0
    assert model.stall_allowance("l4-0") == pytest.approx(allowance - long_prompt.interference_s)
    assert model.protected_streams == 1
    model.finish(short, None, in_flight_left=1)
    assert model.stall_allowance("l4-0") == math.inf and model.protected_streams == 0


def test_a_stream_of_unknown_length_is_not_protected() -> None:
    model, backend = latency_model(), l4()
    book(model, backend, 100, 11)
    book(model, backend, 6000, 64)
    assert model.stall_allowance("l4-0") == math.inf
    assert model.stall_allowance("never-seen") == math.inf


def test_ended_streams_do_not_pile_up_in_the_limits() -> None:
    model, backend = latency_model(), l4()
    book(model, backend, 100, 2000, bound=0.15)  # stays at the top
    for _ in range(1000):
        _, booking = book(model, backend, 100, 20, bound=0.15)
        model.finish(booking, None, in_flight_left=1)
        backend.in_flight -= 1
    # compacted whenever ended entries pass 64 and four times the one in flight
    assert len(model._load["l4-0"].limits) <= 65 and model._load["l4-0"].protected == 1


def scheduler(*, outputs_known: bool) -> Scheduler:
    backends = BackendSet([l4("l4-0"), l4("l4-1")])
    estimator = CostEstimator(
        {gpu: p.cost for gpu, p in PRIORS.items()}, exact_max_tokens=outputs_known
    )
    return Scheduler(backends, build_policy(DEFAULT_POLICY), estimator, latency=latency_model())


def request(rid: int, prompt: int, max_tokens: int) -> RequestLifetime:
    return RequestLifetime(RequestInfo(rid, "m", prompt, max_tokens, slo=STANDARD, arrived_at=0.0))


def test_a_long_prompt_spares_the_short_stream_it_would_break() -> None:
    """l4-1 runs two more streams than l4-0, so by load the 3,000-token prompt would join
    the 3-token answer on l4-0; its chunks would stretch that answer's two gaps past
    0.15 s. Knowing the answer's length, the router sends the prompt to l4-1."""
    for known, expected in ((True, "l4-1"), (False, "l4-0")):
        sched = scheduler(outputs_known=known)
        short = sched.route(request(1, 50, 3), 0.0, random.Random(1))
        assert short is not None and short.backend.backend_id == "l4-0"
        sched.backends.get("l4-1").in_flight += 2
        decision = sched.route(request(2, 3000, 64), 0.0, random.Random(1))
        assert decision is not None and decision.fits
        assert decision.backend.backend_id == expected


def test_a_prefill_that_would_break_a_stream_everywhere_is_a_predicted_miss() -> None:
    sched = scheduler(outputs_known=True)
    for rid in (1, 2):  # a protected 3-token answer on each backend
        sched.route(request(rid, 50, 3), 0.0, random.Random(1))
    held = sched.route(request(3, 3000, 64), 0.0, random.Random(1), hold_misses=True)
    assert held is not None and not held.fits and not held.booked
