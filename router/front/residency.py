"""The regional end of the global tier's residency decision: verify the signed header, that
it was made for this request's key and is used once, and refuse (403) a request whose
decision excludes this router's region, or, when the router serves only traffic from the
global tier, a request that carries no decision at all.

Single use is kept in this process (router/core/replay.py) and, with Redis, across
replicas (`SET NX` until the decision expires); Redis trouble leaves the local check."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

import redis.asyncio as aioredis
from gpuroute.router.core.replay import ReplayGuard
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.shared.redis_client import REDIS_ERRORS

from gpuroute.auth import AuthError, client_key
from gpuroute.openai_api import Rejection
from gpuroute.residency_decision import HEADER, Decision, DecisionError, key_binding, verify

log = logging.getLogger("gpuroute.router.residency")


class ResidencyGate:
    def __init__(
        self,
        key: str | None,
        required: bool,
        place: frozenset[str],
        metrics: RouterMetrics,
        *,
        redis: aioredis.Redis | None = None,
        prefix: str = "gpuroute",
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,  # wall clock: the expiry crosses machines
    ) -> None:
        self.key = None if key is None else key.encode()
        self.required, self.place, self.clock = required, place, clock
        self.metrics = metrics
        self.redis, self.prefix, self.retry_s = redis, prefix, retry_s
        self.used = ReplayGuard()
        self._redis_down_until = 0.0

    @property
    def checks(self) -> bool:
        """Is there anything to check (a decision key)? Callers skip `check` otherwise."""
        return self.key is not None

    async def check(self, headers: Mapping[str, str]) -> None:
        """Rejection (403) unless the request may be served here."""
        if self.key is None:
            return
        value = headers.get(HEADER)
        if value is None:
            if self.required:
                self._refuse("missing", "this router serves requests from the global tier only",
                             "global_decision_required")  # fmt: skip
            return
        now = self.clock()
        try:
            decision = verify(value, self.key, now)
        except DecisionError as exc:
            self._refuse("invalid", str(exc), "invalid_residency_decision")
        if decision.key != _binding(headers):  # AuthError first for a key that is no key
            message = "residency decision was made for another API key"
            self._refuse("other_key", message, "invalid_residency_decision")
        allowed = decision.jurisdictions
        if allowed is not None and allowed.isdisjoint(self.place):
            self._refuse(
                "excluded",
                f"residency allows {', '.join(sorted(allowed))}; this router is in "
                f"{', '.join(sorted(self.place))}",
                "residency_violation",
            )
        if not await self._first_use(decision, now):
            message = "residency decision already used; each is good for one request"
            self._refuse("replayed", message, "invalid_residency_decision")

    def _refuse(self, reason: str, message: str, code: str) -> NoReturn:
        self.metrics.decision_refusals.labels(reason).inc()
        raise Rejection(403, message, code=code)

    async def _first_use(self, decision: Decision, now: float) -> bool:
        if not self.used.first_use(decision.nonce, decision.expires, now):
            return False
        if self.redis is None or now < self._redis_down_until:
            return True
        ttl_ms = max(1, int((decision.expires - now) * 1000) + 1000)
        try:
            fresh = await self.redis.set(
                f"{self.prefix}:decision:{decision.nonce}", b"1", nx=True, px=ttl_ms
            )
        except REDIS_ERRORS as exc:
            self._redis_down_until = now + self.retry_s
            log.warning("residency decisions: Redis unavailable (%s); checked here only", exc)
            return True
        return bool(fresh)


def _binding(headers: Mapping[str, str]) -> str:
    """The request's key as a decision names it; Rejection (400, 401) for a header that
    is no key, as the key check would answer it."""
    try:
        return key_binding(client_key(headers))
    except AuthError as exc:
        raise Rejection(exc.status, exc.message, code=exc.code) from None
