"""The Sentinel client's own parts, without a network (tests/integration/test_redis_sentinel.py
fails real deployments over): the sentinel with the newest configuration epoch is believed,
and a move of the primary, whoever learns of it first, closes every connection to the old
one, those in use too."""

from __future__ import annotations

import asyncio

import pytest
from gpuroute.router.shared.redis_client import NewestSentinels, PrimaryFollowingPool
from redis.asyncio.sentinel import MasterNotFoundError

A, B = ("10.0.0.1", 6379), ("10.0.0.2", 6379)


def state(address: tuple[str, int], epoch: int, **flags: bool) -> dict:
    return {"ip": address[0], "port": address[1], "config-epoch": epoch, "is_master": True,
            "is_sdown": False, "is_odown": False, "num-other-sentinels": 2, **flags}  # fmt: skip


class FakeSentinel:
    def __init__(self, answer: dict | Exception) -> None:
        self.answer = answer

    async def sentinel_masters(self) -> dict:
        if isinstance(self.answer, Exception):
            raise self.answer
        return {"svc": self.answer}


def sentinels(*answers: dict | Exception) -> NewestSentinels:
    manager = NewestSentinels([("127.0.0.1", 1)])  # (connects lazily: never here)
    manager.sentinels = [FakeSentinel(a) for a in answers]  # type: ignore[assignment]
    return manager


def test_the_newest_epoch_is_believed_whatever_answers_first() -> None:
    manager = sentinels(
        state(A, 3), ConnectionError("down"), state(B, 4), state(A, 5, is_sdown=True)
    )
    assert asyncio.run(manager.discover_master("svc")) == B  # (A at 5 is down: not valid)


def test_no_valid_answer_names_the_errors() -> None:
    manager = sentinels(ConnectionError("refused"), state(A, 1, is_odown=True))
    with pytest.raises(MasterNotFoundError, match="refused"):
        asyncio.run(manager.discover_master("svc"))


class FakeManager:
    address = A

    async def discover_master(self, _name: str) -> tuple[str, int]:
        return self.address


class InUse:
    closed = False

    async def disconnect(self, *_args, **_kwargs) -> None:
        self.closed = True


@pytest.mark.parametrize("first", ["recheck", "a new connection"])
def test_a_moved_primary_closes_the_connections_in_use_whoever_learns_it(first) -> None:
    """A new connection asks where the primary is before it opens (redis-py); if it learns
    of the move first, the periodic recheck sees nothing new: the check belongs in the one
    place the address changes."""

    async def run() -> bool:
        manager = FakeManager()
        pool = PrimaryFollowingPool("svc", manager, recheck_s=1.0)  # type: ignore[arg-type]
        await pool.get_master_address()
        busy = InUse()
        pool._in_use_connections.add(busy)  # a command in flight on A
        manager.address = B
        if first == "recheck":
            await pool._recheck()
        else:
            await pool.get_master_address()  # as SentinelManagedConnection.connect does
            await pool._recheck()
        return busy.closed and pool.master_address == B

    assert asyncio.run(run())
