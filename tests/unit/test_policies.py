"""Envoy-style policy tests: many picks against analytic shares, plus exact choices."""

from __future__ import annotations

import math
import random

import pytest
from gpuroute.router.core import Backend, BackendSet, BackendState, RequestInfo, Scheduler
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.policies import POLICIES, build_policy
from gpuroute.router.core.policies.least_connections import LeastConnections
from gpuroute.router.core.policies.least_outstanding_work import (
    LeastOutstandingWork,
    LeastOutstandingWorkSettings,
)
from gpuroute.router.core.policies.load import work_seconds
from gpuroute.router.core.policies.p2c import PowerOfTwoChoices
from gpuroute.router.core.policies.random_pick import RandomPick
from gpuroute.router.core.policies.round_robin import RoundRobin
from gpuroute.router.core.policies.weighted_round_robin import WeightedRoundRobin
from gpuroute.router.core.slow_start import SlowStart
from support.helpers import PRIORS, backends, context, life, shares

PICKS = 100_000


def pick_many(policy, pool, n=PICKS, seed=1):
    ctx = context(pool, seed=seed)
    return [policy.pick(ctx, pool) for _ in range(n)]


def test_registry_builds_each_policy_by_name() -> None:
    for name in POLICIES:
        assert build_policy(name).name == name
    with pytest.raises(ValueError, match=r"unknown policy 'fastest'.*least_outstanding_work"):
        build_policy("fastest")


def test_round_robin_cycles_in_order() -> None:
    pool = backends(3)
    picks = pick_many(RoundRobin(), pool, n=7)
    assert [b.backend_id for b in picks] == ["b0", "b1", "b2", "b0", "b1", "b2", "b0"]


def test_random_is_uniform() -> None:
    pool = backends(4)
    for share in shares(pick_many(RandomPick(), pool), pool):
        assert share == pytest.approx(0.25, abs=0.01)


def test_weighted_round_robin_is_exactly_proportional() -> None:
    pool = [Backend(f"b{i}", "H100", ("m",), capacity=w) for i, w in enumerate((1.0, 2.0, 5.0))]
    picks = pick_many(WeightedRoundRobin(), pool, n=8000)
    assert shares(picks, pool) == pytest.approx([1 / 8, 2 / 8, 5 / 8], abs=1e-3)
    # Smooth: the heaviest never gets more than ceil(5/8 * k) + 1 of any first k picks.
    heavy = 0
    for k, backend in enumerate(picks[:80], start=1):
        heavy += backend.backend_id == "b2"
        assert heavy <= math.ceil(5 * k / 8) + 1


def test_weighted_round_robin_follows_candidate_changes() -> None:
    pool = backends(3)
    policy = WeightedRoundRobin()
    ctx = context(pool)
    policy.pick(ctx, pool)
    subset = pool[1:]
    assert {policy.pick(ctx, subset).backend_id for _ in range(10)} == {"b1", "b2"}


def test_least_connections_ties_are_uniform_and_busy_host_avoided() -> None:
    pool = backends(3)
    pool[2].in_flight = 1
    result = shares(pick_many(LeastConnections(), pool), pool)
    assert result == pytest.approx([0.5, 0.5, 0.0], abs=0.01)


def test_least_connections_weighs_by_capacity() -> None:
    pool = [Backend("big", "H100", ("m",), capacity=4.0), Backend("small", "L4", ("m",))]
    pool[0].in_flight, pool[1].in_flight = 6, 1  # 7/4 < 2/1
    assert LeastConnections().pick(context(pool), pool).backend_id == "big"


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        # Two distinct samples, lower in-flight wins: P(rank k) = 2·(#worse)/(n·(n-1)).
        ((0, 1, 2, 3), (0.5, 1 / 3, 1 / 6, 0.0)),
        # Ties keep the first sample, itself uniform: the two idle hosts split evenly.
        ((0, 0, 5), (0.5, 0.5, 0.0)),
    ],
)
def test_p2c_matches_analytic_shares(loads, expected) -> None:
    pool = backends(len(loads))
    for backend, load in zip(pool, loads, strict=True):
        backend.in_flight = load
    result = shares(pick_many(PowerOfTwoChoices(), pool), pool)
    assert result == pytest.approx(list(expected), abs=0.01)


def test_least_outstanding_work_weighs_cost_per_gpu_type() -> None:
    h100, l4 = Backend("h", "H100", ("m",)), Backend("l", "L4", ("m",))
    request = RequestInfo(1, "m", prompt_tokens=1000, max_tokens=100)
    # cost on H100 = 1000e-4 + 100e-3 = 0.2 s; on L4 = 0.8 s.
    h100.outstanding = 0.5  # 0.7 total vs 0.8 on the idle L4: H100 still finishes sooner
    assert LeastOutstandingWork().pick(context([h100, l4], request), [h100, l4]) is h100
    h100.outstanding = 0.7  # 0.9 vs 0.8: now the L4
    assert LeastOutstandingWork().pick(context([h100, l4], request), [h100, l4]) is l4


def test_least_outstanding_work_divides_by_warmup_factor() -> None:
    pool = backends(2)
    backend_set = BackendSet(pool, slow_start=SlowStart(window_s=10, min_weight=0.1))
    backend_set.set_state(pool[1], BackendState.WARMING, now=0.0, reason="joined")
    pool[0].outstanding = 0.5
    ctx = context(backend_set, RequestInfo(1, "m", 1000, 100), now=5.0)
    # cost 0.2: b0 scores 0.7; b1 (idle, factor 0.5 at half the window) scores 0.4.
    assert work_seconds(ctx, pool[1]) == pytest.approx(0.4)
    assert LeastOutstandingWork().pick(ctx, pool) is pool[1]


def test_least_outstanding_work_sampling_matches_analytic_shares() -> None:
    # Large pool: sample 2 distinct, keep the lower. With distinct loads, the backend of
    # rank k (0 = least loaded) wins with probability (n-1-k) / C(n, 2).
    n = 10
    pool = backends(n)
    for rank, backend in enumerate(pool):
        backend.outstanding = float(rank)
    policy = LeastOutstandingWork(LeastOutstandingWorkSettings(full_scan_max=4, choices=2))
    result = shares(pick_many(policy, pool), pool)
    expected = [(n - 1 - k) / math.comb(n, 2) for k in range(n)]
    assert result == pytest.approx(expected, abs=0.01)


def test_least_outstanding_work_shares_follow_gpu_speed_through_the_ledger() -> None:
    # Booked and never finished: LOW equalises outstanding seconds, so an H100 (4x cheaper
    # per request than an L4) takes 4 requests for each one the L4 takes.
    pool = [Backend("h", "H100", ("m",)), Backend("l", "L4", ("m",))]
    scheduler = Scheduler(BackendSet(pool), LeastOutstandingWork(), CostEstimator(PRIORS))
    rng = random.Random(3)
    for i in range(10_000):
        scheduler.route(life(RequestInfo(i, "m", 1000, 100)), 0.0, rng)
    assert pool[0].in_flight == pytest.approx(8000, abs=1)
    assert pool[1].in_flight == pytest.approx(2000, abs=1)
