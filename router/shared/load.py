"""Router replicas share their outstanding work through Redis, so replicas that each see
only their own traffic stop herding onto the same "least loaded" backend.

Every `publish_interval_s` a replica writes its per-backend outstanding work (msgpack) to a
board and reads its live peers': Redis between replicas (`RedisBoard`), or shared memory
between the worker processes of one router (`worker_board.MemoryBoard`). The sum of the
peers' work lands in each backend's `shared` slot, which least outstanding work adds to the
replica's own ledger. Board trouble: the shares are dropped and the ledger (plus agent
reports) decides alone.

The same exchange carries the prefix index's recent placements (under PREFIXES_KEY, which
no backend id can be, so a peer of an older version skips it): each peer learns the
placements numbered past the last it took from that replica. Under ARRIVALS_KEY each
replica shares its own smoothed arrival rate per pool (router/scaling/autoscaler.py): summed with
the live peers', every replica sizes its pools on the region's rate."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Protocol

import msgpack
import redis.asyncio as aioredis
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.fleet_sizer import PoolRates
from gpuroute.router.core.policies.prefix_index import PrefixIndex
from gpuroute.router.shared.redis_client import REDIS_ERRORS

from gpuroute.runtime import BackgroundLoop

log = logging.getLogger("gpuroute.router.shared.load")
PREFIXES_KEY = "~prefixes"
ARRIVALS_KEY = "~arrivals"  # {pool: requests/s}


def decode_share(blob: bytes | None) -> dict | None:
    """A peer's blob, or None when missing, expired or garbled."""
    if not blob:
        return None
    try:
        share = msgpack.unpackb(blob)
    except (msgpack.UnpackException, ValueError):
        return None
    return share if isinstance(share, dict) else None


def merge_arrivals(shares: Iterable[dict | None]) -> dict[str, float]:
    """The peers' arrival rates summed per pool (a peer without them, or of an older
    version, adds nothing; a garbled entry is skipped)."""
    total: dict[str, float] = {}
    for share in shares:
        rates = share.get(ARRIVALS_KEY) if share is not None else None
        if not isinstance(rates, dict):
            continue
        for pool, rate in rates.items():
            if isinstance(pool, str) and isinstance(rate, (int, float)) and 0 <= rate < math.inf:
                total[pool] = total.get(pool, 0.0) + float(rate)
    return total


def merge_loads(shares: Iterable[dict | None], backends: Iterable[Backend]) -> dict[str, float]:
    """Peers' outstanding work per backend (missing, expired or garbled peers: nothing)."""
    known = {b.backend_id for b in backends}
    total: dict[str, float] = dict.fromkeys(known, 0.0)
    for loads in shares:
        if loads is None:
            continue
        for backend_id, work in loads.items():
            if backend_id in total and isinstance(work, (int, float)):
                total[backend_id] += float(work)
    return total


class RedisBoard:
    """Replicas on any host: one key per replica with a TTL of a few intervals (a dead
    replica's share expires by itself), and a sorted set of the live ones."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "gpuroute",
        interval_s: float = 0.1,
        replica_id: str | None = None,
    ) -> None:
        self.redis = redis  # owned (and closed) by whoever built it
        self.prefix = prefix
        self.ttl_ms = max(int(interval_s * 5 * 1000), 200)
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.peers = 0

    async def exchange(self, mine: bytes) -> list[bytes | None]:
        now_ms = int(time.time() * 1000)
        members = f"{self.prefix}:replicas"
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(f"{self.prefix}:load:{self.replica_id}", mine, px=self.ttl_ms)
            pipe.zadd(members, {self.replica_id: now_ms})
            pipe.zremrangebyscore(members, 0, now_ms - 10 * self.ttl_ms)
            pipe.zrangebyscore(members, now_ms - self.ttl_ms, "+inf")
            *_, alive = await pipe.execute()
        peers = [p.decode() if isinstance(p, bytes) else p for p in alive]
        peers = [p for p in peers if p != self.replica_id]
        self.peers = len(peers)
        return await self.redis.mget([f"{self.prefix}:load:{p}" for p in peers]) if peers else []


class LoadBoard(Protocol):
    """Where peers meet: publish this one's work, get the live peers' (msgpack blobs)."""

    peers: int

    async def exchange(self, mine: bytes) -> list[bytes | None]: ...


class SharedLoad:
    def __init__(
        self,
        board: LoadBoard,
        backends: Callable[[], Iterable[Backend]],
        *,
        interval_s: float = 0.1,
        on_health: Callable[[bool], None] = lambda ok: None,
        prefixes: Callable[[], PrefixIndex | None] = lambda: None,
        rates: PoolRates | None = None,
    ) -> None:
        self.board = board
        self.backends = backends
        self.prefixes = prefixes  # the policy's prefix index, when it keeps one
        # this replica's arrival rate per pool, shared; the peers' summed (None: board down)
        self.rates = PoolRates() if rates is None else rates
        self.share_id = uuid.uuid4().hex[:12]
        self._learned: dict[str, int] = {}  # peer share id -> last placement number taken
        self.interval_s = interval_s
        self.on_health = on_health
        self.healthy = False
        self._loop_task = BackgroundLoop()

    @property
    def peers(self) -> int:
        return self.board.peers

    def start(self) -> None:
        self._loop_task.start(self._loop())

    async def close(self) -> None:
        await self._loop_task.stop()

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
                self._health(True)
            except (*REDIS_ERRORS, ValueError) as exc:
                if self.healthy:
                    log.warning("shared load unavailable (%s); ledger alone", exc)
                self._health(False)
                for b in self.backends():
                    b.shared = 0.0
                self.rates.peers = None
            await asyncio.sleep(self.interval_s * (0.8 + 0.4 * random.random()))  # the period

    async def sync(self) -> None:
        backends = list(self.backends())
        mine: dict = {b.backend_id: round(b.outstanding, 4) for b in backends if b.outstanding > 0}
        index = self.prefixes()
        if index is not None and (recent := index.recent()):
            mine[PREFIXES_KEY] = [self.share_id, recent]
        if rates := {pool: round(rate, 6) for pool, rate in self.rates.own.items() if rate > 0}:
            mine[ARRIVALS_KEY] = rates
        shares = [decode_share(blob) for blob in await self.board.exchange(msgpack.packb(mine))]
        self.rates.peers = merge_arrivals(shares)
        totals = merge_loads(shares, backends)
        for b in backends:
            b.shared = totals.get(b.backend_id, 0.0)
        if index is not None:
            self._learn(index, shares)

    def _learn(self, index: PrefixIndex, shares: list[dict | None]) -> None:
        """Peers' placements this replica has not taken yet (a garbled list is skipped).
        Peers no longer on the board are forgotten: a restarted one comes back numbered
        from 1 under a new id."""
        learned: dict[str, int] = {}
        for share in shares:
            entry = share.get(PREFIXES_KEY) if share is not None else None
            if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str):
                continue
            peer, placements = entry
            try:
                learned[peer] = index.learn(placements, self._learned.get(peer, 0))
            except (TypeError, ValueError):
                continue
        self._learned = learned

    def _health(self, ok: bool) -> None:
        if ok != self.healthy:
            self.healthy = ok
            self.on_health(ok)
