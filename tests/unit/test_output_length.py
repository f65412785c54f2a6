"""The output-length model: exact arithmetic, learning a length-dependent workload, bounds."""

from __future__ import annotations

import random

import pytest
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.output_length import OutputLengthModel, prompt_bucket
from hypothesis import given
from hypothesis import strategies as st


def test_buckets_are_quarter_octaves() -> None:
    assert [prompt_bucket(t) for t in (861, 862, 1023, 1024, 1217, 1218)] == [
        38, 39, 39, 40, 40, 41
    ]  # fmt: skip
    assert prompt_bucket(0) == prompt_bucket(1) == 0


def test_unseen_bucket_predicts_the_models_mean_and_a_seen_one_is_shrunk_towards_it() -> None:
    model = OutputLengthModel(default=256, alpha=0.05, prior_weight=8)
    assert model.expected("m", 1000) == 256  # nothing learned: the default
    for _ in range(4):
        model.observe("m", 1000, 400)
    for _ in range(4):
        model.observe("m", 100, 100)
    assert model.overall("m") == pytest.approx(250)  # running mean of the first 8
    assert model.expected("m", 5000) == pytest.approx(250)  # a bucket never seen
    # 4 samples of 400 against a prior of 8 samples at 250
    assert model.expected("m", 1000) == pytest.approx((4 * 400 + 8 * 250) / 12)
    assert model.expected("m", None) == pytest.approx(250)
    assert model.expected("other", 1000) == 256


def test_learns_a_workload_whose_answers_depend_on_prompt_length() -> None:
    """Azure-conversation-like: 700-1,300-token prompts get long answers, others short."""
    rng = random.Random(7)
    model = OutputLengthModel(default=256, alpha=0.05)
    for _ in range(20_000):
        prompt = rng.randint(100, 4000)
        mean = 400 if 700 <= prompt < 1300 else 100
        model.observe("m", prompt, rng.expovariate(1 / mean))
    assert model.expected("m", 1000) == pytest.approx(400, rel=0.2)
    assert model.expected("m", 3000) == pytest.approx(100, rel=0.2)
    assert model.expected("m", 200) == pytest.approx(100, rel=0.2)


@given(
    st.lists(st.tuples(st.integers(1, 100_000), st.integers(0, 10_000)), min_size=1, max_size=60),
    st.integers(1, 100_000),
)
def test_prediction_stays_within_what_was_observed(samples, prompt) -> None:
    model = OutputLengthModel(default=256, alpha=0.05)
    for p, out in samples:
        model.observe("m", p, out)
    outs = [out for _, out in samples]
    assert min(outs) - 1e-6 <= model.expected("m", prompt) <= max(outs) + 1e-6


def test_estimator_uses_prompt_length_and_max_tokens_still_caps() -> None:
    est = CostEstimator(default_output_tokens=256, alpha=0.05)
    for _ in range(200):
        est.observe_output("m", 500, prompt_tokens=1000)
        est.observe_output("m", 50, prompt_tokens=100)
    assert est.expected_output("m", None, 1000) > 2 * est.expected_output("m", None, 100)
    assert est.expected_output("m", 40, 1000) == 40


def test_exact_max_tokens_is_the_output_length_not_a_cap() -> None:
    """The simulator's oracle runs: max_tokens is the true length, even above the mean."""
    est = CostEstimator(default_output_tokens=256, exact_max_tokens=True)
    assert est.expected_output("m", 900, 1000) == 900
    assert est.expected_output("m", None, 1000) == 256
