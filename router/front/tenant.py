"""The front door's per-key checks, in the order a client hears about them: who are you
(401), may you be served here (403, the key's residency set), how much may you send (429:
quotas, and the tenant's requests in flight).

A key's class is the most it may ask for: a request may name a lower class, never a higher
one. Keyless callers (when allowed) are one tenant, `anonymous`, with their own limits."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping

from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.shared.quotas import AuthError, KeyPolicy, Quotas

from gpuroute.openai_api import Rejection


class TenantGate:
    def __init__(
        self,
        quotas: Quotas,
        metrics: RouterMetrics,
        priorities: tuple[str, ...],
        default_priority: str | None = None,
    ) -> None:
        self.quotas, self.metrics = quotas, metrics
        self.rank = {name: i for i, name in enumerate(priorities)}  # 0: most important
        # the class of a key (or of keyless callers) that names none, and the most it may ask
        self.default_priority = default_priority or priorities[-1]
        self.in_flight: Counter[str] = Counter()  # only tenants with a cap are counted
        self._settling: set[asyncio.Task] = set()  # quota corrections on their way

    def identify(self, headers: Mapping[str, str]) -> KeyPolicy:
        """The caller's key policy (the anonymous one for keyless callers, when allowed);
        Rejection with 400, 401 or 403."""
        try:
            return self.quotas.identify(headers)
        except AuthError as exc:
            if exc.status == 403:
                self.metrics.residency_refusals.labels(self.metrics.tenant_label(exc.tenant)).inc()
            raise Rejection(exc.status, exc.message, code=exc.code) from None

    async def charge(
        self,
        key: KeyPolicy,
        life: RequestLifetime,
        tokens: int | None,
        explicit_priority: bool,
        *,
        request: bool = True,
    ) -> None:
        """Tag the request with the key's tenant and class (the class the request named if
        it is not above the key's, or above the default class for a key that names none),
        count it in flight and take one request (unless `request` is False: `precharge`
        took it) and `tokens` from the tenant's quotas (None: a free route, no tokens);
        Rejection with 429 beyond them. The in-flight slot is taken before the quota's
        await, so concurrent requests each see the others (with Redis, that await is a
        round trip). The slot is the lifetime's (`life.tenant`) until `give_back`."""
        info = life.info
        info.tenant = key.tenant
        ceiling = key.priority or self.default_priority
        if not explicit_priority or self.rank[info.priority] < self.rank[ceiling]:
            info.priority = ceiling
        life.tenant = self._reserve(key)
        try:
            await self._take(key, tokens, request)
        except BaseException:
            self.release(life)
            raise

    async def precharge(self, key: KeyPolicy) -> None:
        """Take the request from the per-minute budget before work the router does for it
        (a Responses follow-up's stored conversation, read from Redis); a tenant at its
        in-flight cap (its slot is not taken here) and a token bucket in debt are refused
        here too. `charge(..., request=False)` follows."""
        self._check_room(key)
        await self._take(key, 0, True)

    @contextlib.asynccontextmanager
    async def lookup(self, key: KeyPolicy) -> AsyncIterator[None]:
        """A request the router answers itself (a stored response by id, the model list):
        one request from the per-minute budget and an in-flight slot while it runs, no
        tokens; Rejection with 429 beyond them."""
        tenant = self._reserve(key)
        try:
            await self._take(key, None, True)
            yield
        finally:
            self.give_back(tenant)

    async def _take(self, key: KeyPolicy, tokens: int | None, request: bool) -> None:
        verdict = await self.quotas.charge(key, tokens, request=request)
        if not verdict.allowed:
            tenant = self.metrics.tenant_label(key.tenant)
            self.metrics.quota_refusals.labels(tenant, verdict.limit).inc()
            raise Rejection(
                429,
                f"rate limit reached for {key.tenant}: {verdict.limit} per minute",
                code="rate_limit_exceeded",
                headers=verdict.headers,
            )

    def _reserve(self, key: KeyPolicy) -> str | None:
        """An in-flight slot of the key's tenant (None: its key has no cap); Rejection
        with 429 at the cap."""
        self._check_room(key)
        if key.max_in_flight is None:
            return None
        self.in_flight[key.tenant] += 1
        return key.tenant

    def _check_room(self, key: KeyPolicy) -> None:
        """Rejection with 429 where the key's tenant holds its every in-flight slot."""
        cap = key.max_in_flight
        if cap is not None and self.in_flight[key.tenant] >= cap:
            tenant = self.metrics.tenant_label(key.tenant)
            self.metrics.quota_refusals.labels(tenant, "in_flight").inc()
            raise Rejection(
                429,
                f"{key.tenant} has {cap} requests in flight, its limit",
                code="concurrency_limit_exceeded",
                headers={"Retry-After": "1"},
            )

    def settle(self, key: KeyPolicy, tokens: int) -> None:
        """Correct the tenant's token quota by what its request used beyond its charge
        (negative: give back); in the background, since the answer has already gone."""
        if not tokens or key.tokens_per_minute is None:
            return
        direction = "debt" if tokens > 0 else "refund"
        tenant = self.metrics.tenant_label(key.tenant)
        self.metrics.quota_settled_tokens.labels(tenant, direction).inc(abs(tokens))
        task = asyncio.get_running_loop().create_task(self.quotas.settle(key, tokens))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def close(self, timeout_s: float = 2.0) -> None:
        """Let quota corrections still on their way land (a drain's last answers), for a
        bounded time: a debt lost here is a tenant over its quota."""
        if self._settling:
            await asyncio.wait(set(self._settling), timeout=timeout_s)

    def release(self, life: RequestLifetime) -> None:
        """The request will not run: its tenant's slot back now."""
        tenant, life.tenant = life.tenant, None
        self.give_back(tenant)

    def give_back(self, tenant: str | None) -> None:
        """A request of `tenant` that held a slot ended (any way at all)."""
        if tenant is not None:
            self.in_flight[tenant] -= 1
            if not self.in_flight[tenant]:
                del self.in_flight[tenant]
