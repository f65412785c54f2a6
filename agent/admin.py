"""The agent's admin listener: status and metrics to read; drain, undrain, standby and
activate to act.

Acting takes a host out of (or back into) the fleet, so POST needs the configured admin
token (`Authorization: Bearer ...`); config refuses an admin listener off loopback
without one. Every route but /healthz sits behind the guard all three tiers share
(gpuroute/admin_guard.py): no `Origin`, JSON actions, and without a token a loopback
caller naming a loopback `Host`, on reads too (`gpuroute agent drain` sends JSON to the
configured address and no `Origin`). A drain asked for here leaves the process running,
in maintenance, until `undrain`; only SIGTERM drains and exits. `standby` takes the host out of the
routers' rotation as a warm standby (Meta `standby`), `activate` puts it back.
`request_admin` is the CLI's side of it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from gpuroute.agent.config import load_agent_config

from gpuroute.admin_guard import host_admin_guards
from gpuroute.config import ConfigError
from gpuroute.openai_api import healthz
from gpuroute.secrets import read_secret


class AgentAdmin:
    def __init__(
        self,
        token: str | None,
        status: Callable[[], dict],
        metrics: Callable[[], bytes],
        drain: Callable[[], Awaitable[dict]],
        undrain: Callable[[], Awaitable[dict]],
        standby: Callable[[bool], dict],
    ) -> None:
        self.token = token
        self.status, self.metrics = status, metrics
        self._drain, self._undrain = drain, undrain
        self._standby = standby  # True: stand by (out of rotation); False: active

    def app(self) -> web.Application:
        """Everything but /healthz behind the one admin guard; reads need no token."""
        app = web.Application(middlewares=host_admin_guards(self.token))
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/drain", self._drain_endpoint)
        app.router.add_post("/undrain", self._undrain_endpoint)
        app.router.add_post("/standby", self._standby_endpoint)
        app.router.add_post("/activate", self._standby_endpoint)
        return app

    async def _status(self, _request: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics(), content_type="text/plain", charset="utf-8")

    async def _drain_endpoint(self, _request: web.Request) -> web.Response:
        return web.json_response(await asyncio.shield(self._drain()))

    async def _undrain_endpoint(self, _request: web.Request) -> web.Response:
        return web.json_response(await self._undrain())

    async def _standby_endpoint(self, request: web.Request) -> web.Response:
        return web.json_response(self._standby(request.path == "/standby"))


def request_admin(path: str, action: str, timeout_s: float | None = None) -> int:
    """`gpuroute agent drain|undrain|standby|activate --config FILE`: ask the running
    agent (with its admin token, when one is configured) and wait for its answer."""
    try:
        config = load_agent_config(path)
        token = read_secret(config, "admin_token", "agent")
    except ConfigError as exc:
        print(f"gpuroute agent {action}: error: {exc}", file=sys.stderr)
        return 2
    url = f"http://{config.admin.host}:{config.admin.port}/{action}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers["Content-Type"] = "application/json"
    wait = timeout_s or config.drain_timeout_s + config.drain_grace_s + 30

    async def call() -> int:
        try:
            timeout = aiohttp.ClientTimeout(total=wait)
            async with (
                aiohttp.ClientSession(timeout=timeout) as s,
                s.post(url, headers=headers, data=b"{}") as response,
            ):
                print(await response.text())
                return 0 if response.status == 200 else 1
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            print(f"gpuroute agent {action}: cannot reach {url}: {exc}", file=sys.stderr)
            return 1

    return asyncio.run(call())
