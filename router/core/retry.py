"""Retries as pure objects (Envoy's retry state and budget): how many attempts a request may
make, the jittered backoff before each retry, and the budget that keeps retries from
multiplying load during an outage. The live router and the simulator both use them."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class FailureKind(enum.StrEnum):
    """Why an attempt failed before its first byte reached the client (or, STREAM, after)."""

    REFUSED = "refused"  # nothing listens: the engine process is gone
    CONNECT = "connect"  # the connection could not be made otherwise
    CONNECTION = "connection"  # the connection died under the request
    TIMEOUT = "timeout"
    STATUS_5XX = "5xx"
    EMPTY = "empty"  # closed before the first byte
    RESCUED = "rescued"  # moved off a lost, ejected or very slow backend
    STREAM = "stream"  # broke after the first byte: never retried

    @property
    def fatal(self) -> bool:
        """The backend is certainly down: its breaker should trip now."""
        return self in (FailureKind.REFUSED, FailureKind.CONNECTION)


@dataclass(frozen=True, slots=True)
class RetrySettings:
    max_attempts: int = 3
    budget_ratio: float = 0.2  # retries in flight / requests in flight
    min_retries_concurrent: int = 3
    backoff_base_s: float = 0.025
    backoff_max_s: float = 0.25


class RetryBudget:
    """Retries in flight may not exceed max(min_retries_concurrent, budget_ratio × requests
    in flight); a request counts from arrival to its end, a retry while its attempt runs."""

    __slots__ = ("active", "active_retries", "settings")

    def __init__(self, settings: RetrySettings) -> None:
        self.settings = settings
        self.active = 0
        self.active_retries = 0

    def allows(self) -> bool:
        s = self.settings
        return self.active_retries < max(s.min_retries_concurrent, s.budget_ratio * self.active)


class Verdict(enum.Enum):
    GO = "go"
    NO_ATTEMPTS_LEFT = "no_attempts_left"
    BUDGET_EXHAUSTED = "budget_exhausted"


class Attempts:
    """One request's attempts. `next()` says whether another may start and after what
    backoff; `failed()` records why the last one failed (a rescue is not the request's
    fault, so it does not use up an attempt, nor the budget)."""

    __slots__ = ("allowed", "count", "last_failure", "running", "settings")

    def __init__(self, settings: RetrySettings) -> None:
        self.settings = settings
        self.count = 0  # attempts started
        self.allowed = settings.max_attempts
        self.last_failure: FailureKind | None = None
        # the attempts started and not ended, innermost last, each whether it is a retry
        # (a stream's continuation runs inside the attempt whose stream broke)
        self.running: list[bool] = []

    def next(self, budget: RetryBudget, rng: random.Random) -> tuple[Verdict, float]:
        """May another attempt start, and after how many seconds of backoff?"""
        if self.count == 0:
            return Verdict.GO, 0.0
        if self.count >= self.allowed:
            return Verdict.NO_ATTEMPTS_LEFT, 0.0
        if self.last_failure is not FailureKind.RESCUED and not budget.allows():
            return Verdict.BUDGET_EXHAUSTED, 0.0
        s = self.settings
        cap = min(s.backoff_max_s, s.backoff_base_s * 2 ** (self.count - 1))
        return Verdict.GO, rng.uniform(0, cap)

    def start(self, budget: RetryBudget) -> None:
        """An attempt begins; a retry counts against `budget` until `end()`."""
        self.count += 1
        self.running.append(self.count > 1)
        if self.running[-1]:
            budget.active_retries += 1

    def end(self, budget: RetryBudget) -> None:
        """The attempt `start()` began last is over (served, failed or moved)."""
        if self.running.pop():
            budget.active_retries -= 1

    def failed(self, kind: FailureKind) -> bool:
        """Record the failure of the attempt just made; True while another may follow."""
        self.last_failure = kind
        if kind is FailureKind.RESCUED:
            self.allowed += 1
        return self.count < self.allowed
