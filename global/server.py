"""`gpuroute global --config FILE`: one OpenAI-compatible endpoint for the world.

Per request: place the client (GeoIP), work out what residency allows, let the policy pick
a region, then forward to that region's router and relay the answer
(global/region_attempts.py: the next region of the decision's order before the first byte,
another allowed region after it for a stream that can go on)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping

from aiohttp import web
from gpuroute.global_.access import ASKED, install_access_log
from gpuroute.global_.client import ClientLocator
from gpuroute.global_.config import GlobalConfig, load_global_config
from gpuroute.global_.core.policy import GlobalDecision, GlobalPolicy, GlobalRequest
from gpuroute.global_.core.residency import ResidencyError, ResidencyRules
from gpuroute.global_.core.spillover import Spillover, SpillSettings
from gpuroute.global_.discovery import RouterDiscovery
from gpuroute.global_.feeds import RegionFeeds
from gpuroute.global_.metrics import GlobalMetrics
from gpuroute.global_.region_attempts import REGION_HEADER, Forwarding, RegionAttempts
from gpuroute.global_.tracing_spans import global_decision
from prometheus_client import generate_latest

from gpuroute import runtime
from gpuroute.admin_guard import admin_guards
from gpuroute.anthropic_errors import ANTHROPIC_ROUTES, anthropic_errors
from gpuroute.auth import AuthError, client_key, key_digest
from gpuroute.headers import FORWARDED_FOR, interpreted
from gpuroute.logs import log_entry
from gpuroute.openai_api import (
    API_ROUTES,
    Rejection,
    clip,
    error_response,
    healthz,
    models_response,
    not_found,
    read_body,
    request_model,
)
from gpuroute.regions import FleetConfig
from gpuroute.secrets import read_secret
from gpuroute.serving import DrainingServer
from gpuroute.tls import client_context
from gpuroute.tracing import install
from gpuroute.upstream import UpstreamPool

ANONYMOUS = "anonymous"  # keyless callers' tenant, as the routers name it

log = logging.getLogger("gpuroute.global")
decision_log = logging.getLogger("gpuroute.global.decisions")
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
        self.attempts: RegionAttempts | None = None  # once the session is open
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
        install_access_log(  # global/access.py
            app, self.config.access_log, API_ROUTES, answered=self.metrics.answered
        )
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
        self.attempts = RegionAttempts(
            self.session, self.feeds, self.policy, self.metrics,
            config=self.config, decision_key=self.decision_key, rng=self.rng,
        )  # fmt: skip
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

    def may_use(self, headers: Mapping[str, str], tenant: str | None, model: str) -> bool:
        """Whether the tenant's `residency.tenant_models` (keyless callers: `anonymous`'s)
        lets it ask for `model`; a key this tier does not know is its router's to judge."""
        lists = self.config.residency.tenant_models
        if tenant is None and client_key(headers) is None:
            tenant = ANONYMOUS
        allowed = lists.get(tenant) if tenant is not None else None
        return allowed is None or model in allowed

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
            body, model, parsed = await self._read(request)
            request[ASKED] = (tenant, model)  # for its access-log line
            if not self.may_use(headers, tenant, model):
                raise Rejection(
                    403, f"this key may not use the model `{clip(model)}`",
                    param="model", code="model_not_allowed",
                )  # fmt: skip
            asked, decision = self._decide(request, headers, tenant, model)
            global_decision(decision, asked.allowed, tenant)
        except Rejection as rejection:
            return rejection.response()
        assert self.attempts is not None
        fwd = Forwarding(request, headers, body, parsed, asked, decision)
        return await self.attempts.forward(fwd)

    async def _read(self, request: web.Request) -> tuple[bytes, str, dict | None]:
        """The raw body, the model it names and the JSON body (None: an upload)."""
        body = await read_body(request, self.config.limits)
        model, parsed = request_model(request.path, body, request.headers.get("Content-Type"))
        return body, model, parsed

    def _decide(
        self, request: web.Request, headers: Mapping[str, str], tenant: str | None, model: str
    ) -> tuple[GlobalRequest, GlobalDecision]:
        """Residency first (fail closed), then the policy's ranking of compliant regions:
        what the policy was asked, and its decision."""
        place = self.locator.place(request.remote, headers.get(FORWARDED_FOR))
        try:
            allowed = self.rules.allowed(
                tenant=tenant, header=headers.get(RESIDENCY_HEADER), country=place.country
            )
        except ResidencyError as exc:
            raise Rejection(400, str(exc), param=RESIDENCY_HEADER) from None
        asked = GlobalRequest(model, allowed, place.location, headers.get(REGION_HEADER))
        decision = self.policy.decide(asked, self.feeds.views, self.rng)
        if self.rng.random() < self.config.decision_log_sample:
            entry = {
                "ts": time.time(), "client": place.address, "country": place.country,
                "unplaced": place.why_unplaced, "model": model,
                "allowed": sorted(allowed.jurisdictions), "rules": list(allowed.rules),
                "order": list(decision.order), "reason": decision.reason,
            }  # fmt: skip
            log_entry(decision_log, "decision", entry, "decision")
        if decision.region is None:
            raise self._refused(decision, model)
        return asked, decision

    def _refused(self, decision: GlobalDecision, model: str) -> Rejection:
        """The refusal for a request no region can take, by its true reason (only a
        residency refusal moves the residency counter, where its alert looks)."""
        reason, rule = decision.reason, " + ".join(decision.rules) or "none"
        self.metrics.refusals.labels(reason).inc()
        if reason == "residency":
            self.metrics.rejections.labels(reason, rule).inc()
            return Rejection(
                403,
                f"no region that serves `{clip(model)}` is allowed by the residency rules ({rule})",
                code=reason,
            )
        if reason == "model_not_found":
            message = f"The model `{clip(model)}` does not exist."
            return Rejection(404, message, param="model", code=reason)
        if reason == "no_backend":
            return Rejection(
                503, f"no allowed region has an engine for `{clip(model)}` in rotation now",
                code=reason,
            )  # fmt: skip
        return Rejection(
            503,
            f"every allowed region that serves `{clip(model)}` is unavailable "
            f"(residency rules: {rule})",
            code=reason,
            headers={"Retry-After": "1"},
        )

    # -- admin ------------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        """The models regions that are up serve, to callers the API would take."""
        headers = interpreted(request.headers.items())
        try:
            tenant = self.tenant(headers, request.remote)
        except Rejection as rejection:
            return rejection.response()
        return models_response(
            m
            for f in self.feeds.feeds.values()
            if f.health.up
            for m in f.models or ()
            if self.may_use(headers, tenant, m)
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
