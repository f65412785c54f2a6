"""The agent's admin listener: status and metrics to read; drain, undrain, standby and
activate to act.

Acting takes a host out of (or back into) the fleet, so POST needs the configured admin
token (`Authorization: Bearer ...`); with none configured, only callers on loopback may
act, and config refuses an admin listener off loopback without a token. Loopback is not
enough against a browser on the same host: a page may POST a form (`text/plain`) to
127.0.0.1, or rebind its own host name to it. So an action must be JSON (which a
cross-origin page cannot send without CORS, and nothing here grants it), must carry no
`Origin` (browsers send it; `gpuroute agent drain` does not), and, without a token, must
name a loopback host. A drain asked for here leaves the process running, in maintenance,
until `undrain`; only SIGTERM drains and exits. `standby` takes the host out of the
routers' rotation as a warm standby (Meta `standby`), `activate` puts it back.
`request_admin` is the CLI's side of it."""

from __future__ import annotations

import asyncio
import hmac
import sys
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from gpuroute.agent.config import load_agent_config

from gpuroute.auth import AuthError, bearer
from gpuroute.config import ConfigError, is_loopback
from gpuroute.headers import interpreted
from gpuroute.openai_api import Rejection, error_response, healthz
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
        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/drain", self._drain_endpoint)
        app.router.add_post("/undrain", self._undrain_endpoint)
        app.router.add_post("/standby", self._standby_endpoint)
        app.router.add_post("/activate", self._standby_endpoint)
        return app

    def refusal(self, request: web.Request) -> web.Response | None:
        """None when the caller may act; else the 401/403/415 to answer."""
        if "Origin" in request.headers:
            return error_response(
                403, "admin actions are not taken from web pages", code="forbidden"
            )
        if request.content_type != "application/json":
            message = "admin actions take Content-Type: application/json"
            return error_response(415, message, code="unsupported_media_type")
        if self.token is None:
            if (
                request.remote is not None
                and is_loopback(request.remote)
                and is_loopback(host_name(request.host))
            ):
                return None
            return error_response(403, "admin actions only from loopback", code="forbidden")
        try:
            key = bearer(interpreted(request.headers.items()).get("authorization"))
        except Rejection as rejection:  # a duplicated Authorization, as everywhere
            return rejection.response()
        except AuthError as exc:
            return error_response(exc.status, exc.message, code=exc.code)
        if key is None or not hmac.compare_digest(key.encode(), self.token.encode()):
            return error_response(401, "admin token required", code="invalid_admin_token")
        return None

    async def _status(self, _request: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics(), content_type="text/plain", charset="utf-8")

    async def _drain_endpoint(self, request: web.Request) -> web.Response:
        if (refused := self.refusal(request)) is not None:
            return refused
        return web.json_response(await asyncio.shield(self._drain()))

    async def _undrain_endpoint(self, request: web.Request) -> web.Response:
        if (refused := self.refusal(request)) is not None:
            return refused
        return web.json_response(await self._undrain())

    async def _standby_endpoint(self, request: web.Request) -> web.Response:
        if (refused := self.refusal(request)) is not None:
            return refused
        return web.json_response(self._standby(request.path == "/standby"))


def host_name(host: str) -> str:
    """The name in a Host header, without its port (`[::1]:7071` -> `::1`)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


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
