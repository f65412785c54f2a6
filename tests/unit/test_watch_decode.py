"""The router's backend watch judges a stream's decode at the load it met."""

from __future__ import annotations

from gpuroute.router.attempts.watch import BackendWatch
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel, Prediction
from gpuroute.router.core.lifetime import Lifetimes, RequestLifetime
from gpuroute.router.core.policies import build_policy

PRIORS = engine_priors("llama-3.1-8b")


def watch_over(*backends: Backend) -> BackendWatch:
    latency = LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()}, window_s=10.0)
    estimator = CostEstimator({gpu: p.cost for gpu, p in PRIORS.items()})
    scheduler = Scheduler(
        BackendSet(backends), build_policy("slo_aware"), estimator, latency=latency
    )
    return BackendWatch(scheduler, PRIORS, lambda: 0.0, 10.0, Lifetimes())


def test_prefill_interference_stretches_the_expected_decode() -> None:
    busy, quiet = Backend("busy", "A100", ("m",)), Backend("quiet", "A100", ("m",))
    watch = watch_over(busy, quiet)
    plain = watch.watcher.decode_expected_s(busy, 100, 8, now=0.0)
    assert watch.watcher.decode_expected_s(quiet, 100, 8, now=0.0) == plain
    # 5 s of prefill beyond the decode steps booked on "busy" in a 10 s window: half its time
    watch.scheduler.latency.book(busy, 8000, 10, 0.0, Prediction(1.0, 0.05, 6.0, 5.0))
    assert watch.watcher.decode_expected_s(busy, 100, 8, now=0.0) == 2 * plain


def test_a_short_answer_is_expected_to_carry_the_stall_booked_after_it() -> None:
    """A 5-token answer, then a long prompt on the same A100: its chunks add 2 s to the
    answer's steps, far more than the 10 s window's average stretch says."""
    a100 = Backend("a100", "A100", ("m",))
    watch = watch_over(a100)
    latency = watch.scheduler.latency
    short, long = (RequestLifetime(RequestInfo(i, "m", 100)) for i in range(2))
    short.latency = latency.book(a100, 100, 5, 0.0, Prediction(0.05, 0.02, 0.05, 0.0))
    plain = watch.watcher.decode_expected_s(a100, 4, 1, now=0.0, life=short)
    long.latency = latency.book(a100, 8000, 10, 0.0, Prediction(1.0, 0.02, 2.4, 2.0))
    assert latency.stall_met(short.latency) == 2.0 and latency.stall_met(long.latency) == 0.0
    stretched = plain / (1 - 2.0 / 10.0)
    assert watch.watcher.decode_expected_s(a100, 4, 1, now=0.0, life=short) == plain + 2.0
    assert watch.watcher.decode_expected_s(a100, 4, 1, now=0.0, life=long) == stretched
    latency.finish(short.latency, None, in_flight_left=1)
    assert latency.stall_met(short.latency) == 0.0


def test_a_stream_of_under_four_tokens_says_only_that_its_backend_finishes() -> None:
    """Its duration is its wait in the prefill queue, which is load: it moves no ratio,
    but its backend is not taken for stalled."""
    a100 = Backend("a100", "A100", ("m",))
    watch = watch_over(a100)
    life = RequestLifetime(RequestInfo(1, "m", 100))
    life.timing = watch.watcher.slowness.start("a100", 0.0, 0.05)
    assert watch.watcher.succeeded(life, a100, 2, now=3.0, first_token_at=2.99) is None
    assert life.timing is None and watch.watcher.slowness._ratio == {}
    assert watch.watcher.slowness._last_finish == {"a100": 3.0}
