"""`gpuroute global --config FILE`: one OpenAI-compatible endpoint for the world.

Per request: place the client (GeoIP), work out what residency allows, let the policy pick
a region, forward to that region's router and relay the response chunk by chunk. Failures
before the first byte move on to the next region of the decision's order (compliant regions
only, by construction); after it, a stream ends with an SSE error event."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping

import orjson
from aiohttp import web
from gpuroute.global_.access import ASKED, install_access_log
from gpuroute.global_.client import ClientLocator
from gpuroute.global_.config import GlobalConfig, load_global_config
from gpuroute.global_.core.policy import GlobalDecision, GlobalPolicy, GlobalRequest
from gpuroute.global_.core.region_health import region_failed
from gpuroute.global_.core.residency import ANY, Allowed, ResidencyError, ResidencyRules
from gpuroute.global_.core.spillover import Spillover, SpillSettings
from gpuroute.global_.discovery import RouterDiscovery
from gpuroute.global_.feeds import RegionFeeds
from gpuroute.global_.metrics import GlobalMetrics
from gpuroute.global_.tracing_spans import global_decision
from prometheus_client import generate_latest

from gpuroute import runtime
from gpuroute.admin_guard import admin_guards
from gpuroute.anthropic_errors import ANTHROPIC_ROUTES, anthropic_errors
from gpuroute.auth import AuthError, client_key, key_digest
from gpuroute.headers import FORWARDED_FOR, interpreted, router_headers
from gpuroute.openai_api import (
    API_ROUTES,
    Rejection,
    error_response,
    healthz,
    models_response,
    not_found,
    read_body,
    request_model,
)
from gpuroute.regions import FleetConfig
from gpuroute.relay import (
    RESPONSE_DROP,
    UPSTREAM_ERRORS,
    RelayedResponse,
    RelayEnd,
    forward_headers,
    relay_body,
)
from gpuroute.residency_decision import HEADER as DECISION_HEADER
from gpuroute.residency_decision import sign
from gpuroute.secrets import read_secret
from gpuroute.serving import DrainingServer
from gpuroute.tls import client_context
from gpuroute.tracing import install, onward
from gpuroute.upstream import UpstreamPool, UpstreamResponse

log = logging.getLogger("gpuroute.global")
decision_log = logging.getLogger("gpuroute.global.decisions")
REGION_HEADER = "x-gpuroute-region"
RESIDENCY_HEADER = "x-gpuroute-residency"
TENANT_HEADER = "x-gpuroute-tenant"  # named by an authenticating gateway in trusted_proxies


class GlobalApp:
    def __init__(
        self,
        config: GlobalConfig,
        fleet: FleetConfig,
        rules: ResidencyRules,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.config, self.fleet, self.rules = config, fleet, rules
        self.rng = rng or random.Random()
        self.metrics = GlobalMetrics()
        spill = Spillover(SpillSettings(**config.spillover.model_dump()))
        self.policy = GlobalPolicy(config.policy, spill)
        self.feeds = RegionFeeds(config, fleet, spill, rng=self.rng, on_change=self._state)
        self.locator = ClientLocator(config.geoip_database, config.trusted_proxies)
        self.router_tls = client_context(config.router_tls, "router_tls")
        key = read_secret(config.residency, "decision_key", "residency")
        self.decision_key = None if key is None else key.encode()
        self.discovery = (
            RouterDiscovery(config.discovery, self.feeds, self.rng)
            if config.discovery.consul
            else None
        )
        self.session: UpstreamPool | None = None
        self.draining = False
        self.active = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._ticker: asyncio.Task | None = None

    def _state(self, region: str, state: str) -> None:
        for s in ("unknown", "up", "down", "recovering"):
            self.metrics.region_state.labels(region, s).set(float(s == state))

    # -- application -----------------------------------------------------------------------
    def app(self) -> web.Application:
        on_public = self.config.admin_on_public_listener
        guards = admin_guards(self.config, "global") if on_public else []
        app = web.Application(
            client_max_size=self.config.limits.max_body_bytes,
            middlewares=[anthropic_errors(ANTHROPIC_ROUTES), *guards],
        )
        for route in API_ROUTES:
            app.router.add_post(route, self.forward)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self.readyz)
        if self.config.admin_on_public_listener:
            self.add_admin_routes(app)
        app.router.add_route("*", "/{tail:.*}", not_found)
        install_access_log(app, self.config.access_log, API_ROUTES)  # global/access.py
        install(app, self.config.tracing, "gpuroute-global")  # request ids, trace context
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    def listening(self, port: int, admin_port: int | None) -> None:
        log.info("global tier listening on port %d (admin: %s)", port, admin_port)

    def add_admin_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/admin/regions", self.admin_regions)

    async def _startup(self, _app: web.Application) -> None:
        limits = self.config.limits
        # No cookie jar (a cookie one region set must never ride on another client's request),
        # bodies passed on as they came; idle connections are let go before a router's
        # header_timeout_s (15 s) closes them.
        self.session = UpstreamPool(
            connect_timeout_s=limits.connect_timeout_s,
            first_byte_timeout_s=limits.first_byte_timeout_s,
            idle_timeout_s=limits.idle_timeout_s,
            tls=self.router_tls,
            keepalive_s=10.0,
        )
        await self.feeds.start()
        if self.discovery is not None:
            self.discovery.start()
        self._ticker = asyncio.create_task(self._tick_loop())

    async def _cleanup(self, _app: web.Application) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self.discovery is not None:
            await self.discovery.close()
        await self.feeds.close()
        if self.session is not None:
            await self.session.close()
        self.locator.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)  # a period, not a synchronisation
            self.feeds.tick()

    # -- the request path ---------------------------------------------------------------------
    def tenant(self, headers: Mapping[str, str], peer: str | None) -> str | None:
        """The tenant whose residency rules apply: from the API key (parsed exactly as the
        routers parse it), or named by an authenticating gateway in `trusted_proxies`.
        With keys configured, a request with no readable key fails closed (Rejection),
        unless `residency.allow_anonymous`."""
        residency = self.config.residency
        keys = residency.api_keys
        try:
            key = client_key(headers)
        except AuthError as exc:
            raise Rejection(exc.status, exc.message, code=exc.code) from None
        if key is not None and (tenant := keys.get(key_digest(key))) is not None:
            return tenant
        if key is not None and residency.refuse_unknown_keys:
            raise Rejection(401, "invalid API key", code="invalid_api_key")
        named = headers.get(TENANT_HEADER)
        if named is not None and self.locator.trusted(peer):  # a gateway in front
            return named
        if keys and key is None and not residency.allow_anonymous:
            raise Rejection(
                401, "missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key"
            )
        return None  # a key without residency rules here: its router authenticates it

    async def forward(self, request: web.Request) -> web.StreamResponse:
        self.active += 1
        self.idle.clear()
        try:
            return await self._forward(request)
        except Exception:  # a bug must still answer in OpenAI's format
            log.exception("global tier failed on a request")
            return error_response(500, "internal error in the global router", code="internal_error")
        finally:
            self.active -= 1
            if self.active == 0:
                self.idle.set()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self.draining:
            return error_response(503, "global router is draining", code="draining")
        try:
            headers = interpreted(request.headers.items())
            # who is asking comes before the body: a keyless 8 MB body is refused unread
            tenant = self.tenant(headers, request.remote)
            body, model = await self._read(request)
            request[ASKED] = (tenant, model)  # for its access-log line
            decision, allowed = self._decide(request, headers, tenant, model)
            global_decision(decision, allowed, tenant)
        except Rejection as rejection:
            return rejection.response()
        return await self._attempt_regions(request, headers, body, decision, allowed)

    async def _read(self, request: web.Request) -> tuple[bytes, str]:
        """The raw body and the model it names."""
        body = await read_body(request, self.config.limits)
        return body, request_model(request.path, body, request.headers.get("Content-Type"))

    def _decide(
        self, request: web.Request, headers: Mapping[str, str], tenant: str | None, model: str
    ) -> tuple[GlobalDecision, Allowed]:
        """Residency first (fail closed), then the policy's ranking of compliant regions."""
        place = self.locator.place(request.remote, headers.get(FORWARDED_FOR))
        try:
            allowed = self.rules.allowed(
                tenant=tenant, header=headers.get(RESIDENCY_HEADER), country=place.country
            )
        except ResidencyError as exc:
            raise Rejection(400, str(exc), param=RESIDENCY_HEADER) from None
        hint = headers.get(REGION_HEADER)
        decision = self.policy.decide(
            GlobalRequest(model, allowed, place.location, hint), self.feeds.views, self.rng
        )
        if self.rng.random() < self.config.decision_log_sample:
            decision_log.info(
                orjson.dumps(
                    {
                        "ts": time.time(), "client": place.address, "country": place.country,
                        "unplaced": place.why_unplaced, "model": model,
                        "allowed": sorted(allowed.jurisdictions), "rules": list(allowed.rules),
                        "order": list(decision.order), "reason": decision.reason,
                    }
                ).decode()
            )  # fmt: skip
        if decision.region is None:
            rule = " + ".join(decision.rules) or "none"
            self.metrics.rejections.labels(decision.reason, rule).inc()
            what = "allowed by residency" if decision.reason == "residency" else "up"
            raise Rejection(
                503,
                f"no region {what} can serve this request (residency rules: {rule})",
                code=decision.reason,
                headers={"Retry-After": "1"} if decision.reason == "no_region_up" else None,
            )
        return decision, allowed

    async def _attempt_regions(
        self,
        request: web.Request,
        read: Mapping[str, str],
        body: bytes,
        decision: GlobalDecision,
        allowed: Allowed,
    ) -> web.StreamResponse:
        """Forward to the decision's regions in order until one answers below 500 (only
        compliant regions are in the order, by construction). A router gets the headers it
        reads, never a caller's forwarding or decision headers: ours replace them."""
        assert self.session is not None
        headers = router_headers(request.headers.items(), read, request.remote) | onward(request)
        last_error = "no attempt"
        for attempt, region in enumerate(decision.order):
            if attempt:
                self.metrics.retries.labels(decision.order[attempt - 1], region).inc()
            base = self.feeds.feeds[region].url
            if base is None:
                continue
            if self.decision_key is not None:  # a fresh nonce for every attempt
                headers[DECISION_HEADER] = self._sign(allowed, read)
            try:
                upstream = await self.session.request("POST", base, request.path_qs, body, headers)
            except UPSTREAM_ERRORS as exc:
                last_error = f"{region}: {type(exc).__name__}"
                self.feeds.forwarded(region, False)
                continue
            if upstream.status >= 500:
                last_error = f"{region}: HTTP {upstream.status}"
                if region_failed(upstream.status, await self._refusal(upstream)):
                    self.feeds.forwarded(region, False)
                upstream.release()
                continue
            streamed = upstream.headers.get("content-type", "").startswith("text/event-stream")
            whole: bytes | None = None
            if not streamed:  # one JSON document: read it all, so a region that dies
                try:  # before finishing it is just another failed attempt
                    whole = await upstream.read()
                except UPSTREAM_ERRORS as exc:
                    last_error = f"{region}: {type(exc).__name__} in the body"
                    upstream.release()
                    self.feeds.forwarded(region, False)
                    continue
            reason = decision.reason if attempt == 0 else "failover"
            self.metrics.requests.labels(region, reason).inc()
            if whole is not None:
                return self._whole(upstream, region, whole)
            return await self._relay(request, upstream, region)
        log.warning("every compliant region failed; last: %s", last_error)
        return error_response(502, "every compliant region failed to answer", code="upstream_error")

    @staticmethod
    async def _refusal(upstream: UpstreamResponse) -> bytes:
        """A 503's body (a router's refusal says why; read within a second), else none."""
        if upstream.status != 503:
            return b""
        with contextlib.suppress(*UPSTREAM_ERRORS, TimeoutError):
            async with asyncio.timeout(1.0):
                return await upstream.read()
        return b""

    def _sign(self, allowed: Allowed, read: Mapping[str, str]) -> str:
        """This request's decision, bound to its key (parsed already: it was valid)."""
        assert self.decision_key is not None
        places = None if allowed.jurisdictions is ANY else allowed.jurisdictions
        api_key = client_key(read)
        ttl = self.config.residency.decision_ttl_s
        return sign(places, self.decision_key, time.time(), api_key=api_key, ttl_s=ttl)

    def _whole(self, upstream: UpstreamResponse, region: str, body: bytes) -> web.Response:
        headers = forward_headers(upstream.headers.items(), RESPONSE_DROP)
        headers[REGION_HEADER] = region
        self.feeds.forwarded(region, True)
        upstream.release()
        return web.Response(status=upstream.status, body=body, headers=headers)

    async def _relay(
        self, request: web.Request, upstream: UpstreamResponse, region: str
    ) -> web.StreamResponse:
        response = RelayedResponse(status=upstream.status)
        response.headers.update(forward_headers(upstream.headers.items(), RESPONSE_DROP))
        response.headers[REGION_HEADER] = region
        try:
            relayed = await relay_body(
                request,
                response,
                upstream,
                broken_message=lambda exc: f"region {region} failed mid-stream",
                write_timeout_s=self.config.limits.client_write_timeout_s,
            )
        finally:
            upstream.release()
        if relayed.end is RelayEnd.CLIENT_TOO_SLOW:
            self.metrics.client_write_timeouts.inc()
        elif relayed.end is not RelayEnd.CLIENT_GONE:
            self.feeds.forwarded(region, relayed.end is RelayEnd.COMPLETE)
        return response

    # -- admin ------------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        """The models regions that are up serve, to callers the API would take."""
        try:
            self.tenant(interpreted(request.headers.items()), request.remote)
        except Rejection as rejection:
            return rejection.response()
        return models_response(
            m for f in self.feeds.feeds.values() if f.health.up for m in f.models or ()
        )

    async def readyz(self, _request: web.Request) -> web.Response:
        if self.draining:
            return error_response(503, "draining", code="draining")
        up = [v.name for v in self.feeds.views if v.up]
        if not up:
            return error_response(503, "no region is up", code="no_region_up")
        return web.json_response({"status": "ready", "regions_up": up})

    async def metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

    async def admin_regions(self, _request: web.Request) -> web.Response:
        return web.json_response({"policy": self.config.policy, "regions": self.feeds.describe()})


class GlobalServer(DrainingServer):
    """Listen, serve, drain on SIGTERM (the same lifecycle as the regional router)."""

    def __init__(self, app: GlobalApp) -> None:
        super().__init__(app, "global")


def run_global(path: str) -> int:
    return runtime.run_from_config(
        "global", path, load_global_config, lambda c: GlobalServer(GlobalApp(*c)).serve()
    )
