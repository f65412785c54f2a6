from __future__ import annotations

import pytest
from gpuroute.router.core import Backend, BackendSet, BackendState
from gpuroute.router.core.cost import CostEstimator, GpuCostPrior
from gpuroute.router.core.slow_start import SlowStart


def test_output_length_is_learned_per_model_and_capped_by_max_tokens() -> None:
    est = CostEstimator(default_output_tokens=256, alpha=0.5)
    assert est.expected_output("m", None) == 256
    est.observe_output("m", 100)  # the first sample replaces the default
    est.observe_output("m", 200)
    assert est.expected_output("m", None) == 150
    assert est.expected_output("m", 40) == 40
    assert est.expected_output("other", 1000) == 256


def test_gpu_rates_are_ewma_and_seconds_use_them() -> None:
    est = CostEstimator({"H100": GpuCostPrior(1e-4, 1e-3)}, alpha=0.5)
    assert est.seconds("H100", 1.0, 1000, 100) == pytest.approx(0.2)
    est.observe_rates("H100", decode_s_per_token=3e-3)
    assert est.rates("H100").decode_s_per_token == pytest.approx(2e-3)
    est.observe_rates("H100", prefill_s_per_token=3e-4)
    assert est.seconds("H100", 1.0, 1000, 100) == pytest.approx(0.2 + 0.2)


def test_unknown_gpu_uses_reference_over_capacity_until_seeded() -> None:
    est = CostEstimator()
    ref = est.reference.seconds(1000, 100)
    assert est.seconds("B200", 2.0, 1000, 100) == pytest.approx(ref / 2)
    est.observe_rates("B200", decode_s_per_token=1e-3)  # one rate alone cannot seed
    assert est.rates("B200") is None
    est.observe_rates("B200", prefill_s_per_token=1e-5, decode_s_per_token=1e-4)
    assert est.seconds("B200", 2.0, 1000, 100) == pytest.approx(0.02)


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
