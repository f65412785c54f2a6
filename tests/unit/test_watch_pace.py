"""The router's backend watch times the streams in flight: a GPU that turns slow shows in
their pace within a few windows, while the requests it finishes still carry its past."""

from __future__ import annotations

import itertools

from gpuroute.router.attempts.watch import BYTES_PER_TOKEN, AttemptWatch, BackendWatch
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.lifetime import Lifetimes, RequestLifetime
from gpuroute.router.core.policies import build_policy
from gpuroute.router.core.watching import PACE_WINDOW_S

from gpuroute.relay.body import ResponseTally

PRIORS = engine_priors("llama-3.1-8b")
SKELETON = b'data: {"choices":[{"delta":{"content":""}}]}\n\n'


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watched(clock: Clock, *backends: Backend) -> BackendWatch:
    latency = LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})
    estimator = CostEstimator({gpu: p.cost for gpu, p in PRIORS.items()})
    scheduler = Scheduler(
        BackendSet(backends), build_policy("slo_aware"), estimator, latency=latency
    )
    return BackendWatch(scheduler, PRIORS, clock, 10.0, Lifetimes())


IDS = itertools.count()


def stream_on(watch: BackendWatch, backend: Backend, tally: ResponseTally) -> RequestLifetime:
    """A request in flight whose stream on `backend` has begun (its lifetime, watched)."""
    life = watch.lifetimes.open(RequestInfo(next(IDS), "m", 100))
    life.shell = AttemptWatch(backend, 1.0)
    watch.streaming(life, tally)
    return life


def relay(tally: ResponseTally, tokens: int) -> None:
    text = b"x" * round(tokens * BYTES_PER_TOKEN)  # as many bytes as the watch counts a token
    tally.add(SKELETON.replace(b'""', b'"' + text + b'"'))


def run_windows(watch: BackendWatch, clock: Clock, streams, speeds, windows: int) -> None:
    """`windows` windows in which each backend's streams relay what its speed (x the
    roofline TPOT) allows."""
    for _ in range(windows):
        clock.now += PACE_WINDOW_S
        for backend, tally in streams:
            tpot = PRIORS[backend.gpu_type].unloaded_tpot_s * speeds[backend.backend_id]
            relay(tally, round(PACE_WINDOW_S / tpot))
        watch.refresh()


def test_a_gpu_that_turns_slow_is_seen_by_its_streams_pace() -> None:
    clock = Clock()
    fleet = [Backend(name, "H100", ("m",)) for name in ("a", "b", "c")]
    watch = watched(clock, *fleet)
    streams = []
    for backend in fleet:
        for _ in range(3):
            tally = ResponseTally(size_text=True)
            relay(tally, 1)  # the first event sizes the stream's events
            stream_on(watch, backend, tally)
            streams.append((backend, tally))
    watch.refresh()  # the first window begins
    speeds = {"a": 2.0, "b": 2.0, "c": 2.0}  # the fake engines' time scale: all alike
    run_windows(watch, clock, streams, speeds, 3)
    assert [b.slowness for b in fleet] == [1.0, 1.0, 1.0]
    speeds["c"] = 20.0
    run_windows(watch, clock, streams, speeds, 1)
    assert fleet[2].slowness == 1.0  # one window is not a run
    run_windows(watch, clock, streams, speeds, 1)
    assert 9.0 <= fleet[2].slowness <= 11.0
    assert fleet[0].slowness == fleet[1].slowness == 1.0


def test_a_hung_engines_streams_read_as_very_slow_and_late_joiners_wait_a_window() -> None:
    """Streams that join mid-window are timed from the next one: timed over the part of
    the window they ran, they would read as slow as a hung engine's."""
    clock = Clock()
    fleet = [Backend(name, "A100", ("m",)) for name in ("a", "b", "c")]
    watch = watched(clock, *fleet)
    watch.refresh()
    clock.now = 1.0  # mid-window: these streams are first timed in the next one
    streams, lives = [], []
    for backend in fleet:
        for _ in range(3):
            tally = ResponseTally(size_text=True)
            relay(tally, 1)
            lives.append(stream_on(watch, backend, tally))
            streams.append((backend, tally))
    hung = {"a": 1.0, "b": 1.0, "c": float("inf")}  # c relays nothing at all
    run_windows(watch, clock, streams, hung, 3)
    assert fleet[2].slowness == 1.0  # the first window was not theirs: two timed so far
    run_windows(watch, clock, streams, hung, 1)
    assert fleet[2].slowness == watch.watcher.slowness.cap
    assert fleet[0].slowness == fleet[1].slowness == 1.0
    for life in lives[6:]:  # once its streams are gone, so is what their pace said
        watch.forget(life)
    run_windows(watch, clock, streams[:6], hung, 1)
    assert fleet[2].slowness == 1.0
