"""The regional router process: build everything from config, serve, drain on SIGTERM.

Config/Server split as in uvicorn: `RouterServer` (router/process.py) owns the sockets and
the lifecycle; the application (routes, proxy, admin) is built from a validated `RouterConfig`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from pathlib import Path

from aiohttp import web
from gpuroute.router.admin.api import Operator
from gpuroute.router.admin.model_routes import AdminRoutes
from gpuroute.router.admin.reload import Roster, Running
from gpuroute.router.attempts.forward import Forwarder
from gpuroute.router.attempts.watch import BackendWatch
from gpuroute.router.backends.assemble import (
    build_scheduler,
    member_kind,
    prior_book,
    router_metrics,
)
from gpuroute.router.backends.health_probes import HealthProbes
from gpuroute.router.backends.health_report import report_health
from gpuroute.router.backends.membership import Membership
from gpuroute.router.backends.registration import RouterRegistration, router_service
from gpuroute.router.config.models import model_routes
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.core.backend import ROUTABLE_STATES, BackendState
from gpuroute.router.core.fleet_sizer import PoolRates
from gpuroute.router.core.lifetime import Lifetimes
from gpuroute.router.core.region_summary import RegionSummary, summarise
from gpuroute.router.core.retry import RetrySettings
from gpuroute.router.front.admission import AdmissionGate
from gpuroute.router.front.residency import ResidencyGate
from gpuroute.router.front.slo import SloGate
from gpuroute.router.front.stages import Front
from gpuroute.router.front.tenant import TenantGate
from gpuroute.router.http.proxy import Proxy
from gpuroute.router.observe.decision_log import DecisionLog
from gpuroute.router.observe.region_report import RegionReportService, start_region_server
from gpuroute.router.responses.routes import add_responses_routes
from gpuroute.router.responses.state import ResponsesState
from gpuroute.router.scaling.autoscaler import Autoscaler
from gpuroute.router.shared.load import RedisBoard, SharedLoad
from gpuroute.router.shared.quotas import Quotas
from gpuroute.router.shared.redis_client import open_redis
from gpuroute.router.shared.sessions import SessionStore
from gpuroute.router.usage.records import UsageRecords
from gpuroute.router.workers.board import MemoryBoard
from gpuroute.router.workers.parent import WorkerRole

from gpuroute.admin_guard import admin_guards
from gpuroute.anthropic_errors import ANTHROPIC_ROUTES, anthropic_errors
from gpuroute.grpc_server import server_credentials
from gpuroute.headers import ENGINE_HEADERS, interpreted
from gpuroute.openai_api import (
    API_ROUTES,
    Rejection,
    error_response,
    healthz,
    models_response,
    not_found,
)
from gpuroute.secrets import read_secret
from gpuroute.tls import client_context
from gpuroute.tracing import install

log = logging.getLogger("gpuroute.router")


class RouterApp:
    """Routes, proxy and admin endpoints of one router. Its parts are built here, in order,
    each handed what it uses when it is made (the composition root: nothing is wired into
    a part after it was built); the operator's side sees only `Running` (router/admin/reload.py)."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        rng: random.Random | None = None,
        role: WorkerRole | None = None,
        path: Path | str | None = None,
    ) -> None:
        self.role = role
        self.workers, self.role_index = (1, 0) if role is None else (role.count, role.index)
        self.reports = self.role_index == 0  # one worker reports the region for all
        self.clock = clock = time.monotonic
        self.book = book = prior_book(config)  # priors per engine kind, more as members join
        self.routes = model_routes(config.models)  # aliases, splits, fallbacks
        self.scheduler = scheduler = build_scheduler(config, book, self.workers)
        self.redis = open_redis(config.redis)  # one client for quotas, sessions, shared load
        self.metrics = router_metrics(config, scheduler, self.routes, self.redis is not None)
        rates = PoolRates()  # this replica's arrivals and its peers', to size pools on
        # pools sized and warm standby brought in and sent back (router/scaling/autoscaler.py)
        self.autoscaler = Autoscaler(config.autoscale, scheduler, config.slo, rates=rates)
        self.metrics.watch_pools(self.autoscaler)
        self.responses = ResponsesState.from_config(config, self.redis, self.workers)
        self.usage = UsageRecords.from_config(config, self.redis, self.metrics)
        limits = {b.backend_id: b.max_inflight for b in config.backends}
        self.gate = AdmissionGate(config.admission, scheduler.backends, limits,
                                  self.metrics, clock, self.autoscaler.standby)  # fmt: skip
        roster = Roster({b.backend_id: b.url for b in config.backends}, self.gate)
        self.lifetimes = Lifetimes(  # the requests in flight, each with its bookings
            RetrySettings(**config.retry.model_dump(exclude={"rescue_slowness"})), scheduler
        )
        self.membership = self._membership(config, roster) if config.membership.consul else None
        # requests waiting on an ejected, lost or very slow backend, moved elsewhere
        self.watch = BackendWatch(scheduler, book.table, clock, config.retry.rescue_slowness,
                                  self.lifetimes, lost=self._lost)  # fmt: skip
        book.listeners.append(self.watch.add_kind)  # a kind first seen as a member joins
        # a predicting policy's misses are held (router/core/placement.py asks the scheduler
        # per request); every policy's attainment is counted
        self.slo = SloGate(config.slo, self.metrics, clock, on_hold=self.autoscaler.held)
        self.decisions = DecisionLog(config.decision_log_sample, config.policy,
                                     keep=config.decision_log_keep)  # fmt: skip
        self.forwarder = self._forwarder(config, rng or random.Random(), roster.urls)
        self.front = self._front(config)
        self.proxy = Proxy(self.front, self.forwarder, self.metrics, clock=clock)
        self.draining, self._ticker = False, None
        self.probes = HealthProbes(lambda: self.config, scheduler, self.forwarder, clock,
                                   self._vouched_for)  # fmt: skip
        self._region_server = None
        self.shared_load = self._shared_load(config, rates)
        self.running = Running(config, scheduler, book, self.routes, self.slo, self.autoscaler,
                               self.decisions, self.front, roster, clock, self.workers,
                               port_given=role is not None)  # fmt: skip
        self.operator = Operator(  # reload, backends, keys, usage (router/admin/api.py)
            self.running, redis=self.redis, quotas=self.front.tenants.quotas,
            usage=self.usage, path=path, count_reload=self.metrics.count_reload,
        )  # fmt: skip
        self.registration: RouterRegistration | None = None
        self.region_port: int | None = None
        listen = config.region.report_listen  # its TLS files read now: a bad one stops the start
        tls = None if listen is None else listen.tls
        self.report_credentials = server_credentials(tls, "region.report_listen.tls")

    @property
    def config(self) -> RouterConfig:
        """The file in force (a reload replaces it)."""
        return self.running.config

    def _vouched_for(self, backend_id: str) -> bool:
        """An agent reports this backend's health through Consul: no checks of our own."""
        return self.membership is not None and backend_id in self.membership.members

    def _lost(self, backend_id: str) -> bool:
        return self.membership is not None and self.membership.lost(backend_id)

    def _front(self, config: RouterConfig) -> Front:
        admission = config.admission
        tenants = TenantGate(
            self._quotas(config), self.metrics, tuple(admission.priorities),
            admission.default_priority,
        )  # fmt: skip
        return Front(
            config,
            self.scheduler.backends,
            tenants,
            self.gate,
            self._residency_gate(config),
            self.slo,
            self.lifetimes,
            self.decisions,
            offer_room=self.forwarder.offer_room,
            with_prefix_blocks="prefix_blocks" in self.scheduler.policy.needs,
            routes=self.routes,
            responses=self.responses,
            usage=self.usage if config.usage.enabled else None,
            autoscaler=self.autoscaler,
        )

    def _quotas(self, config: RouterConfig) -> Quotas:
        quotas = Quotas.from_config(
            config.auth,
            config.redis,
            self.redis,
            self.clock,
            lambda shared: self.metrics.quota_shared.set(shared),
            config.region,
            workers=self.workers,
        )
        self.metrics.quota_shared.set(float(quotas.shared))
        return quotas

    def _residency_gate(self, config: RouterConfig) -> ResidencyGate:
        region = config.region
        key = read_secret(region, "decision_key", "region")
        return ResidencyGate(
            key,
            region.require_global_decision,
            region.place,
            self.metrics,
            redis=self.redis,
            prefix=config.redis.prefix,
            retry_s=config.redis.retry_s,
        )

    def _forwarder(
        self, config: RouterConfig, rng: random.Random, urls: dict[str, str]
    ) -> Forwarder:
        return Forwarder(
            self.scheduler,
            self.metrics,
            self.watch,
            self.decisions,
            self.lifetimes,
            sessions=SessionStore.from_config(config.redis, self.redis, self.clock),
            slo=self.slo,
            has_room=self.gate.has_room,
            clock=self.clock,
            rng=rng,
            expose_backend=config.expose_backend_header,
            engine_key=read_secret(config, "engine_api_key", "router"),
            engine_tls=client_context(config.engine_tls, "engine_tls"),
            engine_headers=ENGINE_HEADERS | frozenset(config.engine_headers),
            continuation=config.continuation,
            standby=self.autoscaler.standby,
            urls=urls,
        )

    def _membership(self, config: RouterConfig, roster: Roster) -> Membership:
        book, metrics = self.book, self.metrics
        kind_of = member_kind(book)
        max_inflight = config.membership.max_inflight
        return Membership(
            config.membership,
            self.scheduler,
            metrics,
            known_gpus=book.gpus,
            capacity_of=lambda member: book.table[kind_of(member)].capacity,
            kind_of=kind_of,
            on_join=lambda b, member: roster.enter(b.backend_id, member.url, max_inflight),
            on_remove=roster.leave,
            on_health=lambda events: report_health(metrics, events),
            clock=self.clock,
            router_id=f"{socket.gethostname()}:{config.listen.port}/{self.role_index}",
        )

    def _shared_load(self, config: RouterConfig, rates: PoolRates) -> SharedLoad | None:
        """Load and prefix placements: through Redis when it is configured (every worker of
        every replica is a peer), else between this router's workers in shared memory."""
        redis, role, scheduler = config.redis, self.role, self.scheduler
        if self.redis is not None and redis.share_load:
            interval = redis.publish_interval_s
            board = RedisBoard(self.redis, prefix=redis.prefix, interval_s=interval)
        elif role is not None:
            board = MemoryBoard(role.board_path, role.index, role.count)
            interval = config.workers.share_interval_s
        else:
            return None  # one process alone: nothing to share
        return SharedLoad(
            board,
            lambda: scheduler.backends,
            interval_s=interval,
            on_health=lambda ok: self.metrics.shared_load_healthy.set(float(ok)),
            prefixes=lambda: scheduler.policy.prefix_index,
            rates=rates,  # replicas size on one rate
        )

    def app(self) -> web.Application:
        """The public application: the OpenAI API, health, allow-listed passthrough paths, and
        admin routes only where the operator put them here (`admin_on_public_listener`)."""
        on_public = self.config.admin_on_public_listener
        guards = admin_guards(self.config, "router") if on_public else []
        app = web.Application(
            client_max_size=self.config.limits.max_body_bytes,
            middlewares=[anthropic_errors(ANTHROPIC_ROUTES), *guards],
        )
        for route in API_ROUTES:
            app.router.add_post(route, self.proxy.openai)
        app.router.add_get("/v1/models", self.models)
        add_responses_routes(app, self.responses, self.front.tenants, self.proxy.access)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self.readyz)
        if self.config.admin_on_public_listener:
            self.add_admin_routes(app)
        for path in self.config.passthrough_paths:
            app.router.add_route("*", path, self.proxy.passthrough)
        app.router.add_route("*", "/{tail:.*}", not_found)
        # request ids, trace context, spans (each with its region)
        install(app, self.config.tracing, "gpuroute-router", self.config.region.name)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    def add_admin_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.metrics_page)
        AdminRoutes(self.running, self.operator, self.membership).add_routes(app)

    @property
    def idle(self) -> asyncio.Event:
        return self.proxy.idle

    @property
    def active(self) -> int:
        return self.proxy.active

    def region_summary(self) -> RegionSummary:
        membership = self.membership
        verified = (lambda _b: True) if membership is None else membership.verified
        return summarise(
            self.scheduler.backends, self.config.region.saturation_delay_s, verified, self.routes
        )

    async def _startup(self, _app: web.Application) -> None:
        await self.forwarder.start(self.config.limits)
        if (listen := self.config.region.report_listen) is not None and self.reports:
            service = RegionReportService(
                self.config.region.name,
                self.region_summary,
                lambda: len(self.gate.queue),
                self.config.region.report_period_s,
                lambda: (self.forwarder.requests.recent_ttft, self.forwarder.requests.recent_e2e),
            )
            self._region_server, self.region_port = await start_region_server(
                service, listen.host, listen.port, self.report_credentials
            )
        if self.membership is not None:
            await self.membership.start()
        if self.shared_load is not None:
            self.shared_load.start()
        self._ticker = asyncio.create_task(self._tick_loop())
        self.autoscaler.start()
        await self.operator.start()

    def listening(self, port: int, admin_port: int | None) -> None:
        """Called once the listeners are bound: register in Consul as gpuroute-router
        when this router discovers backends through Consul and reports its region."""
        if self.membership is None or self.region_port is None:
            return
        address = self.config.region.advertise_address or self.config.listen.host
        service = router_service(self.config, port, self.region_port, address, admin_port)
        self.registration = RouterRegistration(self.membership.client, service)
        self.registration.start()

    async def _cleanup(self, _app: web.Application) -> None:
        self.probes.close()
        if self.membership is not None:
            await self.membership.close()
        if self.registration is not None:
            await self.registration.close()
        if self.shared_load is not None:
            await self.shared_load.close()
        if self._region_server is not None:
            await self._region_server.stop(0.5)
        await self.autoscaler.close()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.operator.close()
        await self.forwarder.close()
        await self.front.tenants.close()
        if self.redis is not None:
            await self.redis.aclose()

    async def _tick_loop(self) -> None:
        """Breaker cooldowns, ejection intervals, warm-up ends and queue deadlines."""
        while True:
            await asyncio.sleep(self.config.tick_s)  # a period, not a synchronisation
            now = self.clock()
            self.forwarder.record_health(self.scheduler.tick(now))
            self.probes.start()
            self.watch.refresh()
            if moved := self.watch.rescue():
                log.warning("moved %d requests off ejected or slow backends", moved)
            self.scheduler.backends.finish_warmups(now)
            if self.membership is not None:
                self.membership.tick()
            self.gate.expire()
            self.gate.dispatch()

    # -- admin -----------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        """The models served here, to callers the API would serve (a key where keys are
        required), less those the caller's key may not use, within the key's per-minute
        requests and in-flight cap."""
        tenants = self.front.tenants
        try:
            key = tenants.identify(interpreted(request.headers.items()))
            async with tenants.lookup(key):
                served = {m for b in self.scheduler.backends for m in b.models}
                names = [*served, *self.routes.reachable(served)]
                return models_response(n for n in names if self.routes.permits(key.models, n))
        except Rejection as rejection:
            return rejection.response()

    async def readyz(self, _request: web.Request) -> web.Response:
        if self.draining:
            return error_response(503, "draining", code="draining")
        backends = self.scheduler.backends
        ready = sum(b.state in ROUTABLE_STATES for b in backends)
        standby = sum(b.state is BackendState.STANDBY for b in backends)  # brought in on demand
        if not ready and not standby:
            return error_response(503, "no backend is routable", code="no_backend")
        answer = {"status": "ready", "routable_backends": ready, "standby_backends": standby}
        return web.json_response(answer)

    async def metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")
