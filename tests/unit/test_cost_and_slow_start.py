from __future__ import annotations

import random

import pytest
from gpuroute.router.core import Backend, BackendSet, BackendState
from gpuroute.router.core.cost import CostEstimator, GpuCostPrior
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies.least_connections import LeastConnections
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.scheduler import Outcome, Scheduler
from gpuroute.router.core.slow_start import SlowStart


def test_output_length_is_learned_per_model_and_capped_by_max_tokens() -> None:
    est = CostEstimator(default_output_tokens=256, alpha=0.5)
    assert est.expected_output("m", None) == 256
    est.observe_output("m", 100)  # the first sample replaces the default
    est.observe_output("m", 200)
    assert est.expected_output("m", None) == 150
    assert est.expected_output("m", 40) == 40
    assert est.expected_output("other", 1000) == 256


def test_seconds_use_the_gpu_types_rates_and_finishes_do_not_move_them() -> None:
    """Rates are priors: what a stream shows of them is inflated by queueing and prefill
    interference, so a served request leaves them where they were."""
    prior = GpuCostPrior(1e-4, 1e-3)
    est = CostEstimator({"H100": prior}, alpha=0.5)
    assert est.seconds("H100", 1.0, 1000, 100) == pytest.approx(0.2)
    scheduler = Scheduler(BackendSet(), LeastConnections(), est)
    backend = Backend("h", "H100", ("m",))
    scheduler.backends.add(backend)
    request = RequestLifetime(RequestInfo(1, "m", 1000))
    scheduler.route(request, 0.0, random.Random(0))
    scheduler.finish(request, Outcome(True, output_tokens=100, prompt_tokens=1000), 5.0)
    assert est.rates("H100") == prior
    assert est.seconds("H100", 1.0, 1000, 100) == pytest.approx(0.2)


def test_unknown_gpu_uses_reference_over_capacity() -> None:
    est = CostEstimator()
    ref = est.reference.seconds(1000, 100)
    assert est.seconds("B200", 2.0, 1000, 100) == pytest.approx(ref / 2)
    assert est.rates("B200") is None


def test_slow_start_ramp_is_envoys_formula() -> None:
    ramp = SlowStart(window_s=10, aggression=2.0, min_weight=0.1)
    assert ramp.factor(0) == 0.1
    assert ramp.factor(2.5) == pytest.approx(0.5)  # (0.25) ** (1/2)
    assert ramp.factor(10) == 1.0 and ramp.finished(10)
    with pytest.raises(ValueError):
        SlowStart(window_s=10, min_weight=0)


def test_backend_set_warms_new_backends_and_caches_routable_lists() -> None:
    pool = BackendSet(slow_start=SlowStart(window_s=10))
    a = Backend("a", "H100", ("m",))
    pool.add(a)
    b = Backend("b", "H100", ("m", "n"), capacity=2.0)
    pool.add(b, now=100.0, warm=True)
    assert b.state is BackendState.WARMING
    assert pool.effective_capacity(b, 105.0) == pytest.approx(1.0)
    assert pool.routable("n") == [b] and pool.routable("m") is pool.routable("m")
    pool.set_state(a, BackendState.DRAINING, 101.0, "drain requested")
    assert pool.routable("m") == [b] and pool.serves("m") and not pool.serves("x")
    assert pool.finish_warmups(109.0) == [] and pool.finish_warmups(110.0) == [b]
    assert b.state is BackendState.READY
    with pytest.raises(ValueError, match="duplicate"):
        pool.add(Backend("a", "L4", ("m",)))


def test_removed_backend_leaves_the_routable_lists() -> None:
    a, b = Backend("a", "H100", ("m",)), Backend("b", "H100", ("m",))
    pool = BackendSet([a, b])
    assert pool.routable("m") == [a, b]
    assert pool.remove("a") is a and "a" not in pool and pool.routable("m") == [b]


def test_served_models_follow_joins_and_removals() -> None:
    """`serves` is asked on every request and kept between changes: a join or a removal must
    still show at once, and a client's unknown names are never kept."""
    pool = BackendSet([Backend("a", "H100", ("m",))])
    assert pool.serves("m") and not pool.serves("n")
    pool.add(Backend("b", "L4", ("n",)))
    assert pool.serves("n")
    pool.remove("a")
    assert not pool.serves("m") and pool.serves("n")
    for i in range(1000):
        assert not pool.serves(f"probe-{i}")
    assert pool._models == frozenset({"n"})
