"""Token bucket: exact refills, and properties over random request sequences."""

from __future__ import annotations

import math

from gpuroute.router.core.token_bucket import TokenBucket, per_minute
from hypothesis import given
from hypothesis import strategies as st


def test_burst_then_steady_refill() -> None:
    b = TokenBucket(rate_per_s=2.0, burst=4.0, now=0.0)
    assert [b.take(0.0).allowed for _ in range(5)] == [True, True, True, True, False]
    refused = b.take(0.0)
    assert refused.retry_after_s == 0.5
    assert b.take(0.5).allowed and not b.take(0.5).allowed
    assert b.take(10.0, cost=4).allowed  # refilled to the burst, never beyond
    assert b.take(10.0, cost=5).retry_after_s == math.inf


def test_a_settled_cost_may_leave_a_debt_that_refills_before_anything_passes() -> None:
    b = TokenBucket(rate_per_s=10.0, burst=100.0, now=0.0)
    assert b.take(0.0, cost=60).allowed  # charged 60 at admission
    b.settle(0.0, 140)  # it used 200: 140 more than charged
    assert b.tokens == -100.0
    refused = b.take(0.0, cost=10)
    assert not refused.allowed and refused.retry_after_s == 11.0  # 110 tokens to go at 10/s
    assert b.take(11.0, cost=10).allowed
    b.settle(11.0, -500)  # a refund never fills it beyond the burst
    assert b.tokens == 100.0


def test_a_bucket_follows_the_level_another_reported_then_refills_from_it() -> None:
    """A router's local bucket takes what the shared one had left (a spent quota stays
    spent through an outage), never more than its own burst."""
    b = TokenBucket(rate_per_s=1.0, burst=10.0, now=0.0)
    b.follow(5.0, 0.5)
    assert not b.take(5.0).allowed and b.take(5.5).allowed
    b.follow(6.0, 99.0)
    assert b.tokens == 10.0


def test_per_minute_limits() -> None:
    assert per_minute(120) == (2.0, 120.0)


@given(
    st.floats(0.1, 100),
    st.floats(1, 1000),
    st.lists(st.tuples(st.floats(0, 5), st.floats(0.1, 50)), max_size=200),
)
def test_never_grants_more_than_burst_plus_refill(rate, burst, steps) -> None:
    b = TokenBucket(rate, burst, 0.0)
    now, granted = 0.0, 0.0
    for gap, cost in steps:
        now += gap
        take = b.take(now, cost)
        if take.allowed:
            granted += cost
            assert take.retry_after_s == 0
        else:
            assert take.retry_after_s > 0
        assert 0 <= b.tokens <= burst + 1e-9
    assert granted <= burst + rate * now + 1e-6


@given(st.floats(0.1, 50), st.floats(1, 100), st.floats(0.1, 20))
def test_waiting_the_hinted_time_is_enough(rate, burst, cost) -> None:
    b = TokenBucket(rate, burst, 0.0)
    while b.take(0.0, cost).allowed:
        pass
    hint = b.take(0.0, cost).retry_after_s
    if math.isfinite(hint):
        assert b.take(hint + 1e-6, cost).allowed
