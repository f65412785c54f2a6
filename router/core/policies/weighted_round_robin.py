"""Weighted round robin as earliest-deadline-first, like Envoy: O(log n) a pick.

Each backend's next deadline advances by 1/weight when picked; the schedule is rebuilt when
the candidate list changes. Weights are capacities (warming backends count less)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import ClassVar

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.base import PickContext, PolicyBase


class WeightedRoundRobin(PolicyBase):
    name: ClassVar[str] = "weighted_round_robin"

    def __init__(self) -> None:
        self._key: tuple[int, tuple[int, ...]] | None = None
        self._heap: list[tuple[float, int, float, Backend]] = []

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend:
        key = (ctx.backends.version, tuple(map(id, candidates)))
        if key != self._key:
            self._rebuild(ctx, candidates)
            self._key = key
        deadline, order, step, backend = self._heap[0]
        heapq.heapreplace(self._heap, (deadline + step, order, step, backend))
        return backend

    def _rebuild(self, ctx: PickContext, candidates: Sequence[Backend]) -> None:
        now_deadline = min((d for d, *_ in self._heap), default=0.0)
        self._heap = []
        for order, backend in enumerate(candidates):
            step = 1.0 / ctx.capacity_of(backend)
            self._heap.append((now_deadline + step, order, step, backend))
        heapq.heapify(self._heap)

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        return 1.0 / ctx.capacity_of(backend)
