"""The lifecycle both HTTP tiers share (uvicorn's Config/Server split): listen on the public
port (and an optional admin port), and on SIGTERM/SIGINT drain: stop accepting, let
in-flight requests and streams finish for up to `drain_timeout_s`, keep the admin listener
up meanwhile (its /readyz says 503), cut what is still running (a stream ends with an
error event), exit."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from gpuroute.admin_guard import admin_guards
from gpuroute.forwarded import TrustedProxies
from gpuroute.http_errors import answer_parse_errors_as_openai
from gpuroute.listener import ConnectionCap, GuardedSite, forwarded_client_cap
from gpuroute.openai_api import healthz
from gpuroute.relay.body import DRAIN_CUT, SERVER_NAME
from gpuroute.runtime import freeze_startup_heap
from gpuroute.tls import server_context

log = logging.getLogger("gpuroute.serving")
# After the drain: how long cut requests get to write their last event, and handlers still
# running on either listener get before aiohttp cancels them (its default is 60 s more)
CUT_GRACE_S = 2.0


async def name_server(_request: web.Request, response: web.StreamResponse) -> None:
    """`Server: gpuroute`, not the HTTP library and its version."""
    response.headers["Server"] = SERVER_NAME


class Servable(Protocol):
    # has listen, admin_listen, admin_on_public_listener, limits, drain_timeout_s,
    # trusted_proxies and the admin token
    config: Any
    draining: bool

    @property
    def idle(self) -> asyncio.Event: ...

    @property
    def active(self) -> int: ...

    def app(self) -> web.Application: ...

    async def readyz(self, request: web.Request) -> web.Response: ...

    def add_admin_routes(self, app: web.Application) -> None: ...

    def listening(self, port: int, admin_port: int | None) -> None: ...


@dataclass(frozen=True)
class WorkerSockets:
    """How one of several worker processes listens: the public port shared with its
    siblings (SO_REUSEPORT: the kernel spreads connections), its admin app on a private
    Unix socket that the parent gathers into one admin listener, and its part of the
    per-address connection cap."""

    admin_socket: Path
    workers: int


class DrainingServer:
    def __init__(self, app: Servable, name: str, worker: WorkerSockets | None = None) -> None:
        self.servable, self.name, self.worker = app, name, worker
        self.tier = name.split()[0]  # "router", "global": where config errors point
        config = app.config
        # certificates are loaded here, before anything starts: a bad file is a config error
        self.tls = server_context(config.listen.tls, "listen.tls")
        self.admin_tls = server_context(config.admin_listen.tls, "admin_listen.tls")
        self.runner: web.AppRunner | None = None
        self.site: GuardedSite | None = None
        self.admin_runner: web.AppRunner | None = None
        self.stopping = asyncio.Event()
        self.handlers: set[asyncio.Task] = set()  # public requests being handled

    @web.middleware
    async def _tracked(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Each public request's task, known to the drain that may have to cut it."""
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            return await handler(request)
        finally:
            self.handlers.discard(task)

    @property
    def port(self) -> int:
        assert self.runner is not None
        return self.runner.addresses[0][1]

    @property
    def admin_port(self) -> int | None:
        if self.admin_runner is None or self.worker is not None:
            return None
        return self.admin_runner.addresses[0][1]

    async def start(self) -> None:
        config = self.servable.config
        listen, limits = config.listen, config.limits
        app = self.servable.app()
        app.on_response_prepare.append(name_server)
        app.middlewares.insert(0, self._tracked)
        workers = 1 if self.worker is None else self.worker.workers
        per_ip = max(1, limits.max_connections_per_ip // workers)
        proxies = TrustedProxies(config.trusted_proxies)
        if proxies:
            app.middlewares.append(forwarded_client_cap(proxies, per_ip))
        self.runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            keepalive_timeout=limits.header_timeout_s,  # the header-read deadline, see listener
            shutdown_timeout=CUT_GRACE_S,
        )
        await self.runner.setup()
        answer_parse_errors_as_openai(self.runner)
        self.site = GuardedSite(
            self.runner,
            listen.host,
            listen.port,
            cap=ConnectionCap(per_ip, exempt=proxies),
            ssl_context=self.tls,
            reuse_port=self.worker is not None,
        )
        await self.site.start()
        if self.worker is not None:
            self.admin_runner = web.AppRunner(
                self.admin_app(), access_log=None, shutdown_timeout=CUT_GRACE_S
            )
            await self.admin_runner.setup()
            await web.UnixSite(self.admin_runner, str(self.worker.admin_socket)).start()
        elif not config.admin_on_public_listener:
            admin = config.admin_listen
            self.admin_runner = web.AppRunner(
                self.admin_app(), access_log=None, shutdown_timeout=CUT_GRACE_S
            )
            await self.admin_runner.setup()
            answer_parse_errors_as_openai(self.admin_runner)
            site = web.TCPSite(
                self.admin_runner, admin.host, admin.port, ssl_context=self.admin_tls
            )
            await site.start()
        self.servable.listening(self.port, self.admin_port)

    def admin_app(self) -> web.Application:
        """Liveness, readiness, metrics and admin on their own listener, off the public port
        (the admin token asked for there; a worker's, on its private socket, answers only
        the parent, which asks for the token on the one admin listener)."""
        guards = [] if self.worker is not None else admin_guards(self.servable.config, self.tier)
        app = web.Application(middlewares=guards)
        app.on_response_prepare.append(name_server)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self.servable.readyz)
        self.servable.add_admin_routes(app)
        return app

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking connections, wait for in-flight requests, close; a second call
        (a second SIGTERM, a test's own drain) finds nothing left to do."""
        s = self.servable
        s.draining = True
        if self.site is None or self.runner is None:
            return
        site, self.site = self.site, None
        await site.stop()  # no new connections
        if timeout is None:
            timeout = s.config.drain_timeout_s
        try:
            await asyncio.wait_for(s.idle.wait(), timeout)
            log.info("%s drained: every in-flight request finished", self.name)
        except TimeoutError:
            log.warning("%s drain timeout (%.0f s): %d requests cut", self.name, timeout, s.active)
            await self._cut()
        await self.runner.cleanup()
        if self.admin_runner is not None:  # kept up during the drain: /readyz says 503
            await self.admin_runner.cleanup()

    async def _cut(self) -> None:
        """Cancel what is still being handled; a stream ends with an error event its client
        cannot miss (gpuroute/relay/body.py), a request not answered yet with its connection."""
        running = [task for task in self.handlers if not task.done()]
        for task in running:
            task.cancel(DRAIN_CUT)
        if running:
            await asyncio.wait(running, timeout=CUT_GRACE_S)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        if (operator := getattr(self.servable, "operator", None)) is not None:
            loop.add_signal_handler(signal.SIGHUP, operator.reload_signal)  # re-read the config
        await self.start()
        freeze_startup_heap()
        url = self.servable.config.listen.url(self.port)
        # a log line like the rest (JSON where logs are JSON), its URL a field of its own
        log.info("gpuroute %s listening on %s", self.name, url, extra={"url": url})
        await self.stopping.wait()
        log.info("signal received: draining")
        signalled = time.monotonic()
        await self.drain()
        log.info("%s stopped %.1f s after the signal", self.name, time.monotonic() - signalled)
