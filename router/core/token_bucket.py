"""A token bucket (pure: `now` is an argument), the same arithmetic as the Redis Lua script
in router/shared/quotas.py so the local fallback behaves like the shared bucket.

`rate_per_s` tokens accrue per second up to `burst`; a request costing `cost` tokens passes
when that many are there, else it is refused with the seconds until they will be. A cost
known only later is settled: it may leave the bucket in debt."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Take:
    allowed: bool
    remaining: float
    retry_after_s: float  # 0 when allowed


class TokenBucket:
    __slots__ = ("burst", "rate_per_s", "stamp", "tokens")

    def __init__(self, rate_per_s: float, burst: float, now: float) -> None:
        if rate_per_s <= 0 or burst <= 0:
            raise ValueError("token bucket needs rate_per_s > 0 and burst > 0")
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens, self.stamp = burst, now

    def take(self, now: float, cost: float = 1.0) -> Take:
        self._refill(now)
        if cost > self.burst:
            return Take(False, self.tokens, math.inf)  # can never pass: the caller says why
        if self.tokens >= cost:
            self.tokens -= cost
            return Take(True, self.tokens, 0.0)
        return Take(False, self.tokens, (cost - self.tokens) / self.rate_per_s)

    def follow(self, now: float, tokens: float) -> None:
        """Take the level another bucket of the same quota reported (no more than full)."""
        self.tokens, self.stamp = min(self.burst, tokens), now

    def settle(self, now: float, cost: float) -> None:
        """Apply `cost` after the fact (negative gives back), whatever is left: the bucket
        may go into debt, and then refuses until it has refilled past it."""
        self._refill(now)
        self.tokens = min(self.burst, self.tokens - cost)

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate_per_s)
        self.stamp = max(self.stamp, now)


def per_minute(limit: float) -> tuple[float, float]:
    """(rate per second, burst) for an OpenAI-style per-minute limit: the whole minute's
    allowance may be spent at once, then it refills evenly."""
    return limit / 60.0, float(limit)
