"""The retry core both worlds use: attempts, backoff, the budget, and the failure kinds."""

from __future__ import annotations

import random

import pytest
from gpuroute.router.core.retry import (
    Attempts,
    FailureKind,
    RetryBudget,
    RetrySettings,
    Verdict,
)

SETTINGS = RetrySettings(
    max_attempts=3, budget_ratio=0.2, min_retries_concurrent=1,
    backoff_base_s=0.025, backoff_max_s=0.25,
)  # fmt: skip


def test_the_first_attempt_goes_at_once_and_draws_no_randomness() -> None:
    rng = random.Random(5)
    state = rng.getstate()
    assert Attempts(SETTINGS).next(RetryBudget(SETTINGS), rng) == (Verdict.GO, 0.0)
    assert rng.getstate() == state  # a fault-free run keeps the routing RNG's stream


def test_attempts_run_out_after_max_attempts() -> None:
    budget, attempts, rng = RetryBudget(SETTINGS), Attempts(SETTINGS), random.Random(1)
    budget.active = 100  # room in the budget: only the attempt count decides
    for expected_more in (True, True, False):
        verdict, _ = attempts.next(budget, rng)
        assert verdict is Verdict.GO
        attempts.start(budget)
        attempts.end(budget)
        assert attempts.failed(FailureKind.STATUS_5XX) is expected_more
    assert attempts.next(budget, rng) == (Verdict.NO_ATTEMPTS_LEFT, 0.0)


def test_backoff_is_jittered_below_a_doubling_cap() -> None:
    settings = RetrySettings(max_attempts=10, backoff_base_s=0.025, backoff_max_s=0.08)
    budget, rng = RetryBudget(settings), random.Random(2)
    budget.active = 1000
    caps = []
    for retry in range(1, 6):
        draws = []
        for _ in range(200):
            attempts = Attempts(settings)
            attempts.count = retry
            verdict, delay = attempts.next(budget, rng)
            assert verdict is Verdict.GO
            draws.append(delay)
        caps.append(max(draws))
        cap = min(0.08, 0.025 * 2 ** (retry - 1))
        assert all(0 <= d <= cap for d in draws)
        assert max(draws) > 0.9 * cap  # uniform over [0, cap]: 200 draws reach its top
    assert caps[0] < caps[1] < caps[2] and caps[3] <= 0.08 and caps[4] <= 0.08


def test_budget_is_the_larger_of_the_minimum_and_the_ratio() -> None:
    budget = RetryBudget(SETTINGS)
    budget.active = 4  # 0.2 x 4 = 0.8 < minimum 1
    assert budget.allows()
    budget.active_retries = 1
    assert not budget.allows()
    budget.active = 20  # 0.2 x 20 = 4
    assert budget.allows()
    budget.active_retries = 4
    assert not budget.allows()


def test_a_retry_counts_against_the_budget_while_it_runs() -> None:
    budget, attempts = RetryBudget(SETTINGS), Attempts(SETTINGS)
    budget.active = 10  # 0.2 x 10 = 2 retries in flight allowed
    attempts.start(budget)  # the first attempt is no retry
    assert budget.active_retries == 0
    attempts.end(budget)
    attempts.failed(FailureKind.TIMEOUT)
    attempts.start(budget)
    assert budget.active_retries == 1
    attempts.end(budget)
    assert budget.active_retries == 0


def test_an_exhausted_budget_stops_retries_but_not_rescues() -> None:
    budget, rng = RetryBudget(SETTINGS), random.Random(3)
    budget.active, budget.active_retries = 5, 1  # max(1, 0.2 x 5) = 1: full
    failed = Attempts(SETTINGS)
    failed.start(budget)
    failed.failed(FailureKind.CONNECTION)
    assert failed.next(budget, rng) == (Verdict.BUDGET_EXHAUSTED, 0.0)
    moved = Attempts(SETTINGS)
    moved.start(budget)
    moved.failed(FailureKind.RESCUED)
    assert moved.next(budget, rng)[0] is Verdict.GO


def test_a_rescue_does_not_use_up_an_attempt() -> None:
    budget, attempts = RetryBudget(SETTINGS), Attempts(SETTINGS)
    for kind in (FailureKind.RESCUED, FailureKind.RESCUED, FailureKind.REFUSED):
        attempts.start(budget)
        attempts.end(budget)
        assert attempts.failed(kind)
    assert (attempts.count, attempts.allowed) == (3, 5)


@pytest.mark.parametrize("kind", list(FailureKind))
def test_only_refused_and_broken_connections_are_fatal(kind) -> None:
    assert kind.fatal is (kind in (FailureKind.REFUSED, FailureKind.CONNECTION))
