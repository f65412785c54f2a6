"""Prefix and session affinity: stickiness, and the load guards that stop hot keys."""

from __future__ import annotations

import random

from gpuroute.router.core import BackendSet, RequestInfo, Scheduler
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.policies.prefix_affinity import PrefixAffinity, PrefixAffinitySettings
from gpuroute.router.core.policies.prefix_index import PrefixIndex
from gpuroute.router.core.policies.session_affinity import (
    SessionAffinity,
    SessionAffinitySettings,
    stable_hash,
)
from support.helpers import PRIORS, backends, context, life


def test_prefix_index_matches_leading_blocks_only() -> None:
    index = PrefixIndex()
    index.record((1, 2, 3), "a")
    index.record((1, 2, 9), "b")
    assert index.matches((1, 2, 3, 4)) == {"b": 2, "a": 3}
    assert index.matches((7, 2, 3)) == {}


def test_prefix_index_is_bounded_lru() -> None:
    index = PrefixIndex(max_blocks=3)
    index.record((1, 2, 3), "a")
    index.record((4,), "b")
    assert len(index) == 3 and index.matches((1,)) == {}


def test_prefix_affinity_follows_the_cached_prefix() -> None:
    pool = backends(4)
    policy = PrefixAffinity()
    first = RequestInfo(1, "m", 2048, 10, prefix_blocks=(11, 12, 13, 14))
    owner = policy.pick(context(pool, first), pool)
    # Busier than the rest (0.15 s), but the 2,048 cached tokens save 0.2 s of prefill:
    # 0.15 + 0.065 on the owner beats 0.27 anywhere else.
    owner.outstanding = 0.15
    follow_up = RequestInfo(2, "m", 2600, 10, prefix_blocks=(11, 12, 13, 14, 15, 16))
    assert policy.pick(context(pool, follow_up), pool) is owner


def test_hot_prefix_cannot_overload_its_owner() -> None:
    pool = backends(4)
    policy = PrefixAffinity(PrefixAffinitySettings(guard_factor=1.5, guard_slack_s=1.0))
    scheduler = Scheduler(BackendSet(pool), policy, CostEstimator(PRIORS))
    rng = random.Random(5)
    for i in range(2000):  # one hot prefix, never finished: the guard must spread it
        scheduler.route(
            life(RequestInfo(i, "m", 4096, 50, prefix_blocks=(1, 2, 3, 4, 5, 6, 7, 8))), 0, rng
        )
    loads = [b.outstanding for b in pool]
    mean = sum(loads) / len(loads)
    cost = 4096 * 1e-4 + 50 * 1e-3
    assert max(loads) <= 1.5 * mean + 1.0 + cost
    assert min(b.in_flight for b in pool) > 0


def test_session_affinity_is_sticky_and_stable() -> None:
    pool = backends(5)
    policy = SessionAffinity()
    request = RequestInfo(1, "m", 10, 10, session_id="user-42")
    homes = {policy.pick(context(pool, request, seed=s), pool).backend_id for s in range(20)}
    assert len(homes) == 1
    # Pinned: changing the hash would move every session off its KV cache on upgrade.
    assert stable_hash("user-42") == 0x6FA0CA4D7BE6EFA6
    assert stable_hash("") == 0xE4A6A0577479B2B4


def test_session_affinity_bounds_load() -> None:
    # All requests in one session: bounded loads spill it once the home holds its share.
    pool = backends(4)
    scheduler = Scheduler(
        BackendSet(pool),
        SessionAffinity(SessionAffinitySettings(load_factor=1.25)),
        CostEstimator(PRIORS),
    )
    rng = random.Random(1)
    for i in range(400):
        scheduler.route(life(RequestInfo(i, "m", 10, 10, session_id="hot")), 0, rng)
    assert max(b.in_flight for b in pool) <= 1.25 * 400 / 4 + 1
    assert min(b.in_flight for b in pool) > 0


def test_session_affinity_spreads_sessions_evenly() -> None:
    pool = backends(4)
    policy = SessionAffinity(SessionAffinitySettings(vnodes=200))
    counts = {b.backend_id: 0 for b in pool}
    for s in range(20_000):
        request = RequestInfo(s, "m", 10, 10, session_id=f"s{s}")
        counts[policy.pick(context(pool, request), pool).backend_id] += 1
    for count in counts.values():
        assert abs(count / 20_000 - 0.25) < 0.05  # ring placement noise with 200 vnodes


def test_session_affinity_without_session_uses_least_work() -> None:
    pool = backends(3)
    pool[0].outstanding, pool[1].outstanding = 5.0, 0.0
    pool[2].outstanding = 3.0
    request = RequestInfo(1, "m", 10, 10)
    assert SessionAffinity().pick(context(pool, request), pool) is pool[1]


def test_prefix_affinity_samples_large_pools_but_always_weighs_prefix_holders() -> None:
    pool = backends(100)
    policy = PrefixAffinity(PrefixAffinitySettings(full_scan_max=8, choices=2))
    blocks = (1, 2, 3, 4)
    owner = policy.pick(context(pool, RequestInfo(1, "m", 2048, 10, prefix_blocks=blocks)), pool)
    for backend in pool:
        backend.outstanding = 0.15  # everyone equally busy: the cached prefix decides
    follow_ups = {
        policy.pick(
            context(pool, RequestInfo(i, "m", 2600, 10, prefix_blocks=blocks), seed=i), pool
        ).backend_id
        for i in range(2, 50)
    }
    assert follow_ups == {owner.backend_id}  # found although only 2 of 100 are sampled


def test_a_preferred_backend_wins_while_it_is_a_candidate() -> None:
    from gpuroute.router.core.backend import BackendState
    from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork

    pool = backends(3)
    pool[1].outstanding = 50.0  # the policy would never pick it
    scheduler = Scheduler(BackendSet(pool), LeastOutstandingWork(), CostEstimator(PRIORS))
    rng = random.Random(0)
    prefer = pool[1].backend_id
    picked = scheduler.route(life(RequestInfo(1, "m", 100)), 0.0, rng, prefer=prefer)
    assert picked.backend is pool[1]
    retry = life(RequestInfo(2, "m", 100), tried=[prefer])
    excluded = scheduler.route(retry, 0.0, rng, prefer=prefer)
    assert excluded.backend is not pool[1]  # a retry excludes it: the policy picks
    scheduler.backends.set_state(pool[1], BackendState.EJECTED, 0.0, "breaker open")
    other = scheduler.route(life(RequestInfo(3, "m", 100)), 0.0, rng, prefer=prefer)
    assert other.backend is not pool[1]  # an ejected backend is no candidate
    gone = life(RequestInfo(4, "m", 100))
    assert scheduler.route(gone, 0.0, rng, prefer="gone").backend in pool
