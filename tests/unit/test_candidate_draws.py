"""A large pool's sample and the pick among its scores draw from the generator exactly as
before they were made cheap: the same indices as `random.sample(range(n), k)`, the same
state afterwards, and no draw where one backend scores lowest."""

from __future__ import annotations

import random

from gpuroute.router.core.policies.base import min_with_random_ties
from gpuroute.router.core.policies.sampling import distinct_indices
from hypothesis import given
from hypothesis import strategies as st


@given(
    seed=st.integers(0, 2**32),
    n=st.integers(1, 5000),
    k=st.integers(0, 40),
    draws=st.integers(1, 4),
)
def test_distinct_indices_are_random_sample_of_the_range(
    seed: int, n: int, k: int, draws: int
) -> None:
    k = min(k, n)
    mine, reference = random.Random(seed), random.Random(seed)
    for _ in range(draws):
        assert distinct_indices(mine, n, k) == reference.sample(range(n), k)
    assert mine.getstate() == reference.getstate()  # what later draws see is unchanged


def test_a_generator_of_another_kind_samples_as_it_always_did() -> None:
    class Counting(random.Random):
        def random(self) -> float:
            return super().random()

    mine, reference = Counting(7), Counting(7)
    assert distinct_indices(mine, 1000, 4) == reference.sample(range(1000), 4)


def test_one_lowest_score_is_picked_without_a_draw_and_ties_draw_as_before() -> None:
    rng, untouched = random.Random(3), random.Random(3)
    assert min_with_random_ties(["a", "b", "c"], [2.0, 1.0, 3.0], rng) == "b"
    assert rng.getstate() == untouched.getstate()
    tied = min_with_random_ties(["a", "b", "c", "d"], [1.0, 2.0, 1.0, 1.0], rng)
    assert tied == untouched.choice(["a", "c", "d"])
