"""Session affinity by consistent hashing with bounded loads (Mirrokni et al., 2018).

A session hashes onto a ring of virtual nodes; it goes to the first backend clockwise whose
in-flight count is within `load_factor` × its fair share (weighted by capacity), so a hot
session moves on instead of overloading its home. Requests without a session id fall back
to least outstanding work."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase, check
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork


def stable_hash(text: str) -> int:
    """64-bit hash that is the same in every process (Python's str hash is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, backends: Sequence[Backend], vnodes: int) -> None:
        points = []
        for backend in backends:
            for replica in range(vnodes):
                points.append((stable_hash(f"{backend.backend_id}#{replica}"), backend))
        points.sort(key=lambda p: (p[0], p[1].backend_id))
        self.hashes = [h for h, _ in points]
        self.owners = [b for _, b in points]

    def walk(self, key_hash: int):
        """Distinct backends in clockwise order starting at `key_hash`."""
        n = len(self.hashes)
        start = bisect.bisect_left(self.hashes, key_hash) % n
        seen: set[str] = set()
        for step in range(n):
            backend = self.owners[(start + step) % n]
            if backend.backend_id not in seen:
                seen.add(backend.backend_id)
                yield backend


@dataclass(frozen=True, slots=True)
class SessionAffinitySettings:
    """`[policy_settings.session_affinity]` (docs/configuration.md)."""

    load_factor: float = 1.25  # a session's home takes it while within this x its fair share
    vnodes: int = 100  # points on the ring per backend

    def __post_init__(self) -> None:
        check(self.load_factor >= 1, "load_factor", "must be >= 1")
        check(self.vnodes >= 1, "vnodes", "must be >= 1")


class SessionAffinity(PolicyBase):
    name: ClassVar[str] = "session_affinity"
    Settings: ClassVar[type] = SessionAffinitySettings
    needs: ClassVar[frozenset[str]] = frozenset({"session_id"})

    def __init__(self, settings: SessionAffinitySettings = SessionAffinitySettings()) -> None:
        self.load_factor = settings.load_factor
        self.vnodes = settings.vnodes
        self.fallback = LeastOutstandingWork()
        self._ring_key: tuple[int, tuple[int, ...]] | None = None
        self._ring: HashRing | None = None

    def ring(self, ctx: PickContext, candidates: Sequence[Backend]) -> HashRing:
        key = (ctx.backends.version, tuple(map(id, candidates)))
        if self._ring is None or key != self._ring_key:
            self._ring, self._ring_key = HashRing(candidates, self.vnodes), key
        return self._ring

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        session = ctx.request.session_id
        if session is None:
            return self.fallback.pick(ctx, candidates)
        # Bound on in-flight (counting the new request): load_factor x the capacity share.
        allowance = self.load_factor * (sum(b.in_flight for b in candidates) + 1)
        allowance /= sum(ctx.capacity_of(b) for b in candidates)
        for backend in self.ring(ctx, candidates).walk(stable_hash(session)):
            if backend.in_flight + 1 <= math.ceil(allowance * ctx.capacity_of(backend)):
                return backend
        return self.fallback.pick(ctx, candidates)  # unreachable: some backend is under bound

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return float(backend.in_flight)
