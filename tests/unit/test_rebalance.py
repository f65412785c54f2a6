"""The rebalancer (router/core/rebalance.py): which running streams move, where, and when a
move is not worth its re-prefill."""

from __future__ import annotations

import pytest
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.policies import build_policy
from gpuroute.router.core.rebalance import (
    Rebalancer,
    RebalanceSettings,
    RunningStream,
    expected_left,
    whole_tpot,
)
from gpuroute.router.core.slo import SloClass
from support.helpers import life

PRIORS = engine_priors("llama-3.1-8b")
NOW = 100.0
SLOWED = 4.0


def fleet(*gpus: str, latency: bool = True) -> Scheduler:
    backends = BackendSet(
        Backend(f"b{i}", gpu, ("m",), capacity=PRIORS[gpu].capacity) for i, gpu in enumerate(gpus)
    )
    model = LatencyModel({g: p.latency for g, p in PRIORS.items()}) if latency else None
    estimator = CostEstimator({g: p.cost for g, p in PRIORS.items()})
    return Scheduler(backends, build_policy("default"), estimator, latency=model)


def tpot_between(scheduler: Scheduler) -> SloClass:
    """A TPOT bound the healthy H100 meets and the slowed one misses (by about half)."""
    latency = scheduler.latency
    assert latency is not None
    slow, fast = (latency.decode_tpot(scheduler.backends.get(b), NOW) for b in ("b0", "b1"))
    assert slow == pytest.approx(SLOWED * fast)
    return SloClass("s", ttft_s=2.0, tpot_s=fast * SLOWED / 2)


def stream(
    scheduler: Scheduler, rid: int, slo: SloClass, left: float, context: int = 600, **kw
) -> RunningStream:
    info = RequestInfo(rid, "m", context, None, slo=slo, arrived_at=NOW - 1)
    return RunningStream(
        life(info, tried=["b0"]),
        scheduler.backends.get("b0"),
        kw.get("first", NOW - 0.2),
        kw.get("delivered", 10),
        left,
        context,
    )


def slowed_pair() -> tuple[Scheduler, SloClass]:
    scheduler = fleet("H100", "H100")
    scheduler.backends.get("b0").slowness = SLOWED  # a gray failure on b0
    return scheduler, tpot_between(scheduler)


def test_the_stream_with_most_output_left_moves_where_it_gains_most() -> None:
    scheduler, slo = slowed_pair()
    streams = [stream(scheduler, rid, slo, left) for rid, left in ((1, 200), (2, 900), (3, 400))]
    (move,) = Rebalancer(scheduler, RebalanceSettings(max_moves=2)).plan(streams, NOW)
    assert move.stream is streams[1] and move.to.backend_id == "b1"  # one move per target
    latency = scheduler.latency
    assert latency is not None
    here = latency.decode_tpot(scheduler.backends.get("b0"), NOW)
    there = latency.predict(move.to, 600, 600, 900, NOW)
    assert move.saved_s == pytest.approx(900 * (here - there.tpot_s))
    assert move.pause_s == there.ttft_s  # its prompt and text so far, prefilled again
    assert whole_tpot(move.stream, NOW, move.pause_s, there.tpot_s) <= slo.tpot_s


def test_moves_per_tick_are_bounded_and_one_per_target() -> None:
    scheduler = fleet("H100", "H100", "H100", "H100")
    scheduler.backends.get("b0").slowness = SLOWED
    slo = tpot_between(scheduler)
    streams = [stream(scheduler, rid, slo, 300 + rid) for rid in range(5)]
    moves = Rebalancer(scheduler, RebalanceSettings(max_moves=2)).plan(streams, NOW)
    assert [m.stream.life.request_id for m in moves] == [4, 3]
    assert len({m.to.backend_id for m in moves}) == 2
    moves = Rebalancer(scheduler, RebalanceSettings(max_moves=8)).plan(streams, NOW)
    assert len(moves) == 3  # the three healthy backends, one move each


def test_no_move_for_a_stream_about_to_end_or_one_that_misses_anywhere() -> None:
    """(What a move's prefill costs against what it saves: the stall test below.)"""
    scheduler, slo = slowed_pair()
    rebalancer = Rebalancer(scheduler, RebalanceSettings(min_tokens_left=32))
    assert rebalancer.plan([stream(scheduler, 1, slo, 31)], NOW) == []  # about to end
    # decoded long enough already that it misses its TPOT wherever it goes
    late = stream(scheduler, 3, slo, 100, first=NOW - 100, delivered=100)
    assert rebalancer.plan([late], NOW) == []
    assert len(rebalancer.plan([stream(scheduler, 4, slo, 100)], NOW)) == 1


def test_streams_meeting_their_tpot_stay_though_elsewhere_is_faster() -> None:
    """b1 would finish it four times sooner, but it meets its bound where it is."""
    scheduler, tight = slowed_pair()
    loose = SloClass("s", ttft_s=2.0, tpot_s=tight.tpot_s * 4)
    rebalancer = Rebalancer(scheduler, RebalanceSettings())
    assert rebalancer.plan([stream(scheduler, 1, loose, 900)], NOW) == []
    assert len(rebalancer.plan([stream(scheduler, 1, tight, 900)], NOW)) == 1  # (the control)


def test_without_a_latency_model_nothing_moves() -> None:
    scheduler = fleet("H100", "H100", latency=False)
    scheduler.backends.get("b0").slowness = SLOWED
    slo = SloClass("s", ttft_s=2.0, tpot_s=0.001)
    assert (
        Rebalancer(scheduler, RebalanceSettings()).plan([stream(scheduler, 1, slo, 900)], NOW) == []
    )


def test_the_stall_its_prefill_adds_on_a_busy_target_counts_against_a_move() -> None:
    """Its re-prefill stalls every stream on the target: past some number of them the move
    costs more than it saves, though it would still meet its own TPOT there."""
    scheduler, slo = slowed_pair()
    latency, target = scheduler.latency, scheduler.backends.get("b1")
    assert latency is not None
    here = latency.decode_tpot(scheduler.backends.get("b0"), NOW)
    moving = stream(scheduler, 1, slo, 900, context=4000)
    rebalancer = Rebalancer(scheduler, RebalanceSettings(min_gain=4.0))
    there = latency.predict(target, 4000, 4000, 900, NOW)
    most = int((900 * (here - there.tpot_s) / 4.0 - there.ttft_s) / there.interference_s)
    assert most > 0
    for in_flight, moves in ((most, 1), (most + 1, 0)):
        target.in_flight = in_flight
        there = latency.predict(target, 4000, 4000, 900, NOW)
        assert whole_tpot(moving, NOW, there.ttft_s, there.tpot_s) <= slo.tpot_s
        assert len(rebalancer.plan([moving], NOW)) == moves


def test_a_streams_tokens_left_are_guessed_conservatively() -> None:
    assert expected_left(500, 100) == 100  # no more than came so far
    assert expected_left(500, 400) == 100  # the booking's guess less what came
    assert expected_left(500, 600) == 0  # past its guess: nothing to count on
