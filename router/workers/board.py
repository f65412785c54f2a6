"""The board a router's worker processes share their outstanding work on: one row per
worker in a memory-mapped file, each row written by its worker alone.

Why shared memory and not Redis between the workers of one host: a row costs one memcpy
to publish and N-1 to read, no round trip, no server to run, and nothing to fail (see
docs/operations.md, "Workers", for the measurement). Routers on different hosts still share
through Redis (`redis.share_load`), and then their workers do too.

Each row is a seqlock: the writer makes the sequence odd, writes, makes it even; a reader
that sees an odd or changed sequence reads again, so it never keeps a torn row."""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Callable
from pathlib import Path

ROW_BYTES = 256 * 1024  # ~4,000 backends' msgpack {id: work} per worker
HEADER = struct.Struct("<QdI")  # sequence, stamp (CLOCK_MONOTONIC, one clock per host), length
PAYLOAD = ROW_BYTES - HEADER.size
READ_TRIES = 4


class BoardFull(ValueError):
    """A worker's share does not fit its row."""


def create_board(path: Path, workers: int) -> None:
    """The parent makes the file (zeroes: every row empty) before any worker starts."""
    with path.open("wb") as f:
        f.truncate(workers * ROW_BYTES)
    path.chmod(0o600)


class MemoryBoard:
    """One worker's view of the board: `exchange` publishes its row and returns the rows
    of the workers that wrote within `fresh_s` (a dead worker's row goes quiet by itself)."""

    def __init__(
        self,
        path: Path,
        index: int,
        workers: int,
        *,
        fresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index, self.workers, self.fresh_s, self.clock = index, workers, fresh_s, clock
        with path.open("r+b") as f:
            self.map = mmap.mmap(f.fileno(), workers * ROW_BYTES)
        self.sequence = 0
        self.peers = 0

    def close(self) -> None:
        self.map.close()

    def publish(self, payload: bytes) -> None:
        if len(payload) > PAYLOAD:
            raise BoardFull(f"{len(payload)} bytes of shared load exceed a row ({PAYLOAD})")
        base = self.index * ROW_BYTES
        self.sequence += 1  # odd: being written
        HEADER.pack_into(self.map, base, self.sequence, 0.0, 0)
        self.map[base + HEADER.size : base + HEADER.size + len(payload)] = payload
        self.sequence += 1  # even: whole
        HEADER.pack_into(self.map, base, self.sequence, self.clock(), len(payload))

    def read(self, index: int) -> tuple[float, bytes] | None:
        """(stamp, payload) of one row, or None if it never held a whole value."""
        base = index * ROW_BYTES
        for _ in range(READ_TRIES):
            sequence, stamp, length = HEADER.unpack_from(self.map, base)
            if sequence == 0 or sequence % 2:
                continue
            payload = self.map[base + HEADER.size : base + HEADER.size + length]
            if HEADER.unpack_from(self.map, base)[0] == sequence:
                return stamp, payload
        return None

    async def exchange(self, mine: bytes) -> list[bytes]:
        self.publish(mine)
        now, rows = self.clock(), []
        for index in range(self.workers):
            if index == self.index or (row := self.read(index)) is None:
                continue
            stamp, payload = row
            if now - stamp <= self.fresh_s:
                rows.append(payload)
        self.peers = len(rows)
        return rows
