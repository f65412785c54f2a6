"""Autoscaling cores: the arrival rate, a pool's size, the seasonal forecast, warm standby
and the attempts loop bringing a standby backend in (router/core/autoscale.py,
seasonal.py, standby.py, placement.py)."""

from __future__ import annotations

import math
import random

import pytest
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, Scheduler
from gpuroute.router.core.autoscale import (
    ArrivalRate,
    AutoscaleSettings,
    MeanLengths,
    PoolScaler,
    backend_capacity_rps,
    slo_capacity_rps,
)
from gpuroute.router.core.backend import BackendState
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.lifetime import Event
from gpuroute.router.core.placement import AttemptLoop, Step
from gpuroute.router.core.policies import DEFAULT_POLICY, build_policy
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.retry import RetryBudget, RetrySettings
from gpuroute.router.core.seasonal import SeasonalRate, SeasonalSettings
from gpuroute.router.core.slo import DEFAULT_SLO_CLASSES, SloClasses
from gpuroute.router.core.slo_admission import HoldQueue
from gpuroute.router.core.standby import PROMOTED, RELEASED, StandbyRotation
from hypothesis import given, settings
from hypothesis import strategies as st
from support.helpers import life

PRIORS = engine_priors("llama-3.1-8b")
INTERACTIVE = next(c for c in DEFAULT_SLO_CLASSES if c.name == "interactive")
CAPACITY = 10.0  # requests/s one backend serves within the SLO, in these tests


def feed(scaler: PoolScaler, rate: float, start: float, end: float, step: float = 1.0):
    """`rate` arrivals/s for the pool "m" from `start` to `end`, sized every `step`."""
    size = None
    t = start
    while t < end - 1e-9:
        scaler.arrive("m", rate * step)
        t += step
        size = scaler.size("m", t, size.active if size else 1, CAPACITY, None)
    return size


def scaler(**overrides) -> PoolScaler:
    values = {"standby_backends": 0, "lead_time_s": 0.0, "scale_down_after_s": 60.0}
    return PoolScaler(AutoscaleSettings(**(values | overrides)))


# -- the arrival rate ----------------------------------------------------------------------
def test_the_rate_is_the_first_interval_at_once_then_follows_a_step_smoothly() -> None:
    rate = ArrivalRate(window_s=30.0, trend_window_s=120.0)
    rate.update(0.0)
    rate.arrive(50)
    assert rate.update(10.0) == pytest.approx(5.0)  # primed: no ramp up from zero
    for t in range(11, 400):
        rate.arrive(20)
        rate.update(float(t))
    assert rate.rate == pytest.approx(20.0, rel=0.01)
    assert abs(rate.slope) < 0.01


def test_a_rising_rate_has_a_positive_trend_that_reads_ahead() -> None:
    rate = ArrivalRate(window_s=30.0, trend_window_s=60.0)
    rate.update(0.0)
    for t in range(1, 600):
        rate.arrive(10 + 0.1 * t)  # +0.1 req/s every second
        rate.update(float(t))
    assert rate.slope == pytest.approx(0.1, rel=0.15)
    assert rate.ahead(100) == pytest.approx(rate.rate + 100 * rate.slope)
    assert ArrivalRate(30, 60).ahead(10) == 0.0


# -- a pool's size -------------------------------------------------------------------------
def test_the_pool_grows_at_once_to_hold_the_demand_at_the_high_mark() -> None:
    s = scaler()
    feed(s, 50.0, 0, 1)  # the first tick only starts the clock
    size = feed(s, 50.0, 1, 2)
    assert size.active == math.ceil(50 / (CAPACITY * 0.8)) == 7
    assert size.reason == "demand ahead above the high mark"
    size = feed(s, 50.0, 2, 20)
    assert (size.active, size.reason) == (7, "steady")
    assert size.utilisation == pytest.approx(50 / (7 * CAPACITY), rel=0.05)


def test_the_lead_time_sizes_for_the_demand_a_new_backend_will_meet() -> None:
    """Rising 0.2 req/s each second: with a 100 s lead the pool sizes for ~20 req/s more."""
    late, early = scaler(), scaler(lead_time_s=100.0)
    for s in (late, early):
        t = 0.0
        while t < 300:
            s.arrive("m", 10 + 0.2 * t)
            t += 1
            size = s.size("m", t, 1, CAPACITY, None)
        s.result = size  # type: ignore[attr-defined]
    assert early.result.active > late.result.active  # type: ignore[attr-defined]
    assert early.result.forecast_rps == pytest.approx(  # type: ignore[attr-defined]
        late.result.forecast_rps + 100 * 0.2,
        rel=0.15,  # type: ignore[attr-defined]
    )


def test_a_held_request_grows_the_pool_by_one_whatever_the_estimate() -> None:
    s = scaler()
    feed(s, 5.0, 0, 10)  # one backend is plenty by the estimate
    s.held("m")
    size = s.size("m", 11.0, 1, CAPACITY, None)
    assert (size.active, size.reason) == (2, "requests held by the SLO gate")


def test_a_fall_within_the_band_waits_out_the_window_then_tracks_its_peak() -> None:
    s = scaler(scale_down_after_s=60.0)
    assert feed(s, 50.0, 0, 20).active == 7
    size = feed(s, 30.0, 20, 60)  # 30/70 = 0.43: above the low mark; the window holds 50
    assert size.active == 7  # and the last change (at 1 s) is not a window old
    size = feed(s, 30.0, 60, 200)
    assert size.active == math.ceil(30 / 8) == 4


def test_a_quiet_spell_shrinks_at_once() -> None:
    s = scaler(scale_down_after_s=600.0)
    assert feed(s, 50.0, 0, 20).active == 7
    size = feed(s, 10.0, 20, 200)  # the rate sinks below 0.3 x 70 = 21 req/s
    assert size.active <= math.ceil(21 / 8)  # long before the 600 s window


def test_standby_is_on_top_and_the_bounds_hold() -> None:
    size = feed(scaler(standby_backends=2, max_backends=6), 100.0, 0, 10)
    assert (size.active, size.standby, size.desired) == (4, 2, 6)  # max 6 holds both
    size = feed(scaler(min_backends=3), 0.0, 0, 10)
    assert size.active == 3


def test_a_forecast_raises_the_size_and_never_lowers_it() -> None:
    high = PoolScaler(AutoscaleSettings(standby_backends=0), forecast=lambda pool, h: 90.0)
    low = PoolScaler(AutoscaleSettings(standby_backends=0), forecast=lambda pool, h: 1.0)
    assert feed(high, 20.0, 0, 10).active == math.ceil(90 / 8)
    assert feed(low, 20.0, 0, 10).active == math.ceil(20 / 8)


def test_settings_refuse_a_band_upside_down_or_bounds_that_cannot_hold() -> None:
    with pytest.raises(ValueError, match="scale_down_utilisation < scale_up_utilisation"):
        AutoscaleSettings(scale_up_utilisation=0.3, scale_down_utilisation=0.8)
    with pytest.raises(ValueError, match="max_backends must hold"):
        AutoscaleSettings(min_backends=4, standby_backends=2, max_backends=5)


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(st.floats(0, 200), min_size=5, max_size=40),
    standby=st.integers(0, 3),
    low=st.integers(0, 4),
)
def test_the_size_stays_within_its_bounds_and_never_drops_inside_the_window(
    rates, standby, low
) -> None:
    s = scaler(standby_backends=standby, min_backends=low, max_backends=30)
    last, changed = None, -1e9
    for k, rate in enumerate(rates):
        s.arrive("m", rate * 10)
        t = 10.0 * (k + 1)
        size = s.size("m", t, last or 1, CAPACITY, None)
        assert low <= size.active <= 30 - standby and size.standby == standby
        if last is not None and size.active < last:
            quiet = size.reason == "below the low mark"
            assert quiet or t - changed >= 60.0, (k, size)
        if size.active != last:
            changed = t
        last = size.active


# -- one backend's capacity ----------------------------------------------------------------
def test_capacity_is_the_saturated_rate_bounded_by_the_tpot_a_stream_must_keep() -> None:
    h100, l4 = PRIORS["H100"], PRIORS["L4"]
    assert slo_capacity_rps(l4.latency, 1000, 250, 0.05) < slo_capacity_rps(
        l4.latency, 1000, 250, 0.2
    )
    assert slo_capacity_rps(h100.latency, 1000, 250, 0.1) > 5 * slo_capacity_rps(
        l4.latency, 1000, 250, 0.1
    )
    work = h100.cost.seconds(1000, 250)
    assert backend_capacity_rps(work, None, 1000, 250, 0.1) == pytest.approx(1 / work)
    bounded = backend_capacity_rps(work, l4.latency, 1000, 250, 0.05)
    assert bounded == slo_capacity_rps(l4.latency, 1000, 250, 0.05)


def test_mean_lengths_follow_the_traffic() -> None:
    lengths = MeanLengths(weight=10)
    for _ in range(100):
        lengths.served(4000, 50)
    assert lengths.prompt == pytest.approx(4000, rel=0.01)
    assert lengths.output == pytest.approx(50, rel=0.01)


# -- the seasonal forecast -----------------------------------------------------------------
def test_the_seasonal_model_sees_the_peak_coming_after_two_seasons() -> None:
    season = SeasonalSettings(season_s=960.0, buckets_per_season=16)
    model = SeasonalRate(season)
    rng = random.Random(3)
    t = 0.0

    def truth(x: float) -> float:
        return 5 + 4 * math.sin(2 * math.pi * x / 960)

    while t < 1.5 * 960:
        t += rng.expovariate(truth(t))
        model.arrive(t)
    assert model.forecast(t, 240) is None  # one and a half seasons: no model yet
    while t < 3 * 960 - 100:
        t += rng.expovariate(truth(t))
        model.arrive(t)
    ahead = model.forecast(t, 240)
    assert ahead is not None
    expected = max(truth(t + k) for k in range(0, 240, 10))
    assert ahead == pytest.approx(expected, rel=0.2)


def admitted(request: RequestInfo):
    lifetime = life(request)
    lifetime.move(Event.ADMIT)
    return lifetime


# -- warm standby --------------------------------------------------------------------------
def backends_with_standby() -> BackendSet:
    backends = BackendSet(
        [
            Backend("l4-0", "L4", ("m",), capacity=PRIORS["L4"].capacity),
            Backend("h100-1", "H100", ("m",), capacity=PRIORS["H100"].capacity),
            Backend("a100-2", "A100", ("m",), capacity=PRIORS["A100"].capacity),
        ]
    )
    for backend_id in ("h100-1", "a100-2"):
        backends.set_state(backends.get(backend_id), BackendState.STANDBY, 0.0, "consul")
    return backends


def test_promotion_takes_the_most_capable_standby_and_release_waits_for_quiet() -> None:
    backends = backends_with_standby()
    rotation = StandbyRotation(backends, release_after_s=30.0)
    assert [b.backend_id for b in rotation.waiting("m")] == ["h100-1", "a100-2"]
    promoted = rotation.promote("m", 5.0)
    assert promoted is not None and promoted.backend_id == "h100-1"
    assert (promoted.state, promoted.reason) == (BackendState.READY, PROMOTED)
    assert [b.backend_id for b in backends.routable("m")] == ["l4-0", "h100-1"]
    assert rotation.release(10.0, lambda b: True) == []  # quiet since 10
    assert rotation.release(35.0, lambda b: False) == []  # busy again: the clock restarts
    assert rotation.release(40.0, lambda b: True) == []
    released = rotation.release(70.0, lambda b: True)
    assert [b.backend_id for b in released] == ["h100-1"]
    assert (promoted.state, promoted.reason) == (BackendState.STANDBY, RELEASED)
    assert (rotation.promotions, rotation.releases) == (1, 1)
    assert rotation.promote("other-model", 80.0) is None


def test_a_backend_the_fleet_activated_is_no_longer_the_routers_to_release() -> None:
    backends = backends_with_standby()
    rotation = StandbyRotation(backends, release_after_s=0.0)
    promoted = rotation.promote("m", 0.0)
    assert promoted is not None
    backends.set_state(promoted, BackendState.READY, 1.0, "consul: active")
    assert rotation.release(100.0, lambda b: True) == []
    assert rotation.promoted() == []


def test_the_attempts_loop_brings_standby_in_before_a_request_would_wait() -> None:
    """An L4 cannot meet an interactive TTFT for a long prompt; the warm H100 can: the
    request is booked there at once instead of being held."""
    backends = backends_with_standby()
    estimator = CostEstimator({gpu: p.cost for gpu, p in PRIORS.items()})
    latency = LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})
    scheduler = Scheduler(backends, build_policy(DEFAULT_POLICY), estimator, latency=latency)
    classes = SloClasses(DEFAULT_SLO_CLASSES, "standard")
    budget = RetryBudget(RetrySettings())
    request = RequestInfo(1, "m", 12_000, 64, slo=INTERACTIVE, arrived_at=0.0)
    without = AttemptLoop(scheduler, budget, HoldQueue(classes))
    assert without.route(admitted(request), 0.0, random.Random(0)).step is Step.HOLD
    rotation = StandbyRotation(backends)
    loop = AttemptLoop(scheduler, budget, HoldQueue(classes), rotation)
    placement = loop.route(admitted(request), 0.0, random.Random(0))
    assert placement.step is Step.SEND
    assert placement.decision is not None
    assert placement.decision.backend.backend_id == "h100-1"
    assert rotation.promotions == 1


def test_a_less_important_request_waits_behind_a_held_more_important_one() -> None:
    """Room that frees goes to the held interactive request first: a batch request that
    would fit now is held too (it has the budget to wait), instead of taking that room."""
    backends = BackendSet([Backend("l4-0", "L4", ("m",), capacity=PRIORS["L4"].capacity)])
    estimator = CostEstimator({gpu: p.cost for gpu, p in PRIORS.items()})
    latency = LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})
    scheduler = Scheduler(backends, build_policy(DEFAULT_POLICY), estimator, latency=latency)
    classes = SloClasses(DEFAULT_SLO_CLASSES, "standard")
    batch_class = next(c for c in DEFAULT_SLO_CLASSES if c.name == "batch")
    loop = AttemptLoop(scheduler, RetryBudget(RetrySettings()), HoldQueue(classes))
    batch = RequestInfo(2, "m", 200, 16, slo=batch_class, arrived_at=0.0)
    assert loop.route(admitted(batch), 0.0, random.Random(0)).step is Step.SEND
    interactive = admitted(RequestInfo(1, "m", 12_000, 64, slo=INTERACTIVE, arrived_at=0.0))
    assert loop.route(interactive, 0.0, random.Random(0)).step is Step.HOLD
    later = admitted(RequestInfo(3, "m", 200, 16, slo=batch_class, arrived_at=0.0))
    placement = loop.route(later, 0.0, random.Random(0))
    assert placement.step is Step.HOLD and placement.decision is not None
    assert not placement.decision.booked  # it waits its turn (the next shows it fits)
    assert loop.holds is not None and loop.holds.remove(interactive)
    # the interactive class was held within its TTFT budget (0.5 s): the engine queue a
    # batch request would deepen is one an interactive arrival may wait behind
    fresh = admitted(RequestInfo(4, "m", 200, 16, slo=batch_class, arrived_at=0.4))
    assert loop.route(fresh, 0.4, random.Random(0)).step is Step.HOLD
    fresh = admitted(RequestInfo(5, "m", 200, 16, slo=batch_class, arrived_at=0.6))
    assert loop.route(fresh, 0.6, random.Random(0)).step is Step.SEND
