"""Replicas' outstanding work through a real redis-server; herding avoidance in the policy."""

from __future__ import annotations

from collections import Counter

import msgpack
import pytest
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.least_outstanding_work import (
    LeastOutstandingWork,
    LeastOutstandingWorkSettings,
)
from gpuroute.router.shared.load import RedisBoard, SharedLoad, decode_share, merge_loads
from support.helpers import backends, context
from support.live import async_wait_for, holds
from support.redis_server import SHARED_STATE_TIMEOUT_S, client


def test_merge_ignores_expired_unknown_and_garbled_entries() -> None:
    pool = [Backend("a", "H100", ["m"]), Backend("b", "H100", ["m"])]
    blobs = [
        msgpack.packb({"a": 1.5, "zz": 9.0}),
        None,
        b"\xc1garbage",
        msgpack.packb({"a": 0.5, "b": 2}),
    ]
    assert merge_loads(map(decode_share, blobs), pool) == {"a": 2.0, "b": 2.0}


def test_pick_among_spreads_over_the_best_few_only() -> None:
    pool = backends(4)
    for b, work in zip(pool, (0.0, 0.1, 5.0, 9.0), strict=True):
        b.outstanding = work
    policy = LeastOutstandingWork(LeastOutstandingWorkSettings(pick_among=2))
    ctx = context(pool, seed=1)
    picks = Counter(policy.pick(ctx, pool).backend_id for _ in range(4000))
    assert set(picks) == {pool[0].backend_id, pool[1].backend_id}
    assert abs(picks[pool[0].backend_id] / 4000 - 0.5) < 0.03


@pytest.mark.asyncio
async def test_each_replica_sees_the_others_work_and_drops_it_when_redis_goes(redis) -> None:
    mine = [Backend("b1", "H100", ["m"]), Backend("b2", "H100", ["m"])]
    theirs = [Backend("b1", "H100", ["m"]), Backend("b2", "H100", ["m"])]
    mine[0].outstanding, theirs[1].outstanding = 5.0, 2.5
    health: list[bool] = []
    clients = [client(redis.url, SHARED_STATE_TIMEOUT_S) for _ in range(2)]  # one per replica
    a = SharedLoad(RedisBoard(clients[0]), lambda: mine, interval_s=0.05, on_health=health.append)
    b = SharedLoad(RedisBoard(clients[1]), lambda: theirs, interval_s=0.05)
    try:
        await a.sync()
        await b.sync()
        await a.sync()
        assert (theirs[0].shared, theirs[1].shared) == (5.0, 0.0)
        assert (mine[0].shared, mine[1].shared) == (0.0, 2.5)
        assert a.peers == b.peers == 1
        a.start()
        await async_wait_for(holds(lambda: a.healthy), 5, "the first sync")
        redis.stop()
        await async_wait_for(holds(lambda: mine[1].shared == 0.0), 5, "peer work dropped")
        assert health[-1] is False
    finally:
        await a.close()
        await b.close()
        for c in clients:
            await c.aclose()
