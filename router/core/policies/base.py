"""The one interface every load-balancing policy implements.

Policies see only core types. They read load (`in_flight`, `outstanding`) from backends and
costs through PickContext; they never change load themselves (the ledger does)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.latency import LatencyModel, Prediction
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.slo import STANDARD

READY = BackendState.READY


@dataclass(frozen=True, slots=True)
class Verdict:
    """A predicting policy's choice: where, what it predicts there, and whether that meets
    the request's SLO (a miss is held or refused by SLO-aware admission, not sent)."""

    backend: Backend
    prediction: Prediction
    fits: bool
    preferred: bool = False  # the session's remembered backend
    needed: float | None = None  # the SLO margin it needed to fit (its verdict moves margins)


class PickContext:
    """Everything a policy may consult for one decision; costs are memoised per GPU type."""

    __slots__ = (
        "_costs",
        "backends",
        "estimator",
        "expected_output",
        "latency",
        "now",
        "preferred",
        "request",
        "rng",
        "slo",
    )

    def __init__(
        self,
        request: RequestInfo,
        backends: BackendSet,
        estimator: CostEstimator,
        now: float,
        rng: random.Random,
        latency: LatencyModel | None = None,
        preferred: str | None = None,
    ) -> None:
        self.request = request
        self.backends = backends
        self.estimator = estimator
        self.now = now
        self.rng = rng
        self.latency = latency
        self.preferred = preferred  # a session's remembered backend, for policies that weigh it
        self.slo = request.slo or STANDARD  # a request no front classified
        self.expected_output = estimator.expected_output(
            request.model, request.max_tokens, request.prompt_tokens
        )
        self._costs: dict[tuple[str, float], float] = {}

    def cost_on(self, backend: Backend) -> float:
        """GPU-seconds this request would cost on `backend`."""
        key = (backend.gpu_type, backend.capacity)
        cost = self._costs.get(key)
        if cost is None:
            cost = self.estimator.seconds(
                backend.gpu_type, backend.capacity, self.request.prompt_tokens, self.expected_output
            )
            self._costs[key] = cost
        return cost

    def capacity_of(self, backend: Backend) -> float:
        """Nominal capacity weight, reduced while the backend warms up."""
        if backend.state is READY:
            return backend.capacity
        return self.backends.effective_capacity(backend, self.now)

    def warmup_factor(self, backend: Backend) -> float:
        if backend.state is READY:
            return 1.0
        return self.backends.slow_start.factor(self.now - backend.state_since)

    def work_score(self, backend: Backend, cost: float | None = None) -> float:
        """Seconds until the backend would finish its outstanding work plus this request,
        stretched by how much slower than expected it has been running."""
        if cost is None:
            cost = self.cost_on(backend)
        # peers' exact ledgers and the agent's inferred surplus describe the same requests
        work = backend.outstanding + max(backend.external, backend.shared) + cost
        return work * backend.slowness / self.warmup_factor(backend)


class Policy(Protocol):
    """Chooses one backend among non-empty `candidates`."""

    name: ClassVar[str]
    # request data the policy reads beyond size and model ("prefix_blocks", "session_id"),
    # so a shell computes it only for policies that use it
    needs: ClassVar[frozenset[str]]

    def pick(self, ctx: PickContext, candidates: Sequence[Backend]) -> Backend: ...

    def score(self, ctx: PickContext, backend: Backend) -> float | None:
        """The number the policy ranks by (lower is better), for the decision log."""
        ...


def min_with_random_ties(
    candidates: Sequence[Backend], scores: Sequence[float], rng: random.Random
) -> Backend:
    """The lowest-scoring candidate; exact ties are broken uniformly at random."""
    best = min(scores)
    tied = [c for c, s in zip(candidates, scores, strict=True) if s == best]
    return tied[0] if len(tied) == 1 else rng.choice(tied)
