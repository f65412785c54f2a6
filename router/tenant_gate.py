"""The front door's per-key checks, in the order a client hears about them: who are you
(401), may you be served here (403, the key's residency set), how much may you send (429)."""

from __future__ import annotations

from aiohttp import web
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.metrics import RouterMetrics
from gpuroute.router.quotas import AuthError, KeyPolicy, Quotas

from gpuroute.openai_api import Rejection


class TenantGate:
    def __init__(self, quotas: Quotas, metrics: RouterMetrics) -> None:
        self.quotas, self.metrics = quotas, metrics

    def identify(self, request: web.Request) -> KeyPolicy | None:
        """The caller's key policy (None: no keys in use); Rejection with 401 or 403."""
        try:
            return self.quotas.identify(request.headers.get("Authorization"))
        except AuthError as exc:
            if exc.status == 403:
                self.metrics.residency_refusals.labels(exc.tenant).inc()
            raise Rejection(exc.status, exc.message, code=exc.code) from None

    async def charge(self, key: KeyPolicy, info: RequestInfo, explicit_priority: bool) -> None:
        """Tag the request with the key's tenant (and class, unless the request named one),
        then take it from the tenant's quotas; Rejection with 429 beyond them."""
        info.tenant = key.tenant
        if key.priority is not None and not explicit_priority:
            info.priority = key.priority
        verdict = await self.quotas.charge(key, info.prompt_tokens + (info.max_tokens or 0))
        if not verdict.allowed:
            self.metrics.quota_refusals.labels(key.tenant, verdict.limit).inc()
            raise Rejection(
                429,
                f"rate limit reached for {key.tenant}: {verdict.limit} per minute",
                code="rate_limit_exceeded",
                headers=verdict.headers,
            )
