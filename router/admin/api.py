"""The operator's API on the admin listener (behind the admin token where one is
configured, on loopback otherwise: gpuroute/admin_guard.py): reload the config, add, drain
and remove static backends, list, add and revoke API keys, show the effective config
with its secrets redacted, and read the per-tenant usage records."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiohttp import web
from gpuroute.router.admin.keys import KeyNotShared, KeyStore, key_from_body
from gpuroute.router.admin.reload import Reloader, Running
from gpuroute.router.config.auth import key_problem
from gpuroute.router.config.router import BackendConfig
from gpuroute.router.shared.quotas import Quotas
from gpuroute.router.usage.records import UsageRecords
from pydantic import ValidationError

from gpuroute.config import ConfigError
from gpuroute.openai_api import clip, error_response

log = logging.getLogger("gpuroute.router.admin")
REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"(token|_key|password|secret)$")
URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@/]*@")
DIGEST = re.compile(r"^[0-9a-f]{64}$")


def redacted(value: Any, name: str = "") -> Any:
    """`value` with every secret hidden: keys named *token, *_key, *password, *secret (and
    their _file/_env forms keep only where they point), and passwords inside URLs."""
    if isinstance(value, dict):
        return {k: redacted(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, name) for v in value]
    if value is not None and SECRET_NAME.search(name):
        return REDACTED
    if isinstance(value, str):
        return URL_PASSWORD.sub(r"\1" + REDACTED + "@", value)
    return value


async def json_body(request: web.Request) -> dict:
    body = orjson.loads(await request.read())
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    return body


def invalid(exc: ValidationError, code: str) -> web.Response:
    """A body the config's own model refused: 400 naming the first field at fault."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    message = f"{field}: {first['msg']}" if field else first["msg"]
    return error_response(400, clip(message, 1000), param=field, code=code)


class Operator:
    """Reload, backends, keys and usage records of one router process."""

    def __init__(
        self,
        router: Running,
        *,
        redis: aioredis.Redis | None,
        quotas: Quotas,
        usage: UsageRecords,
        path: Path | str | None = None,
        count_reload: Callable[[str, str], None] = lambda _outcome, _via: None,
    ) -> None:
        """`count_reload(outcome, via)`: counts each reload, however it was asked for."""
        self.router = router
        self.count_reload = count_reload
        self.keys = KeyStore(router, redis, quotas)
        self.reloader = Reloader(router, path, on_keys=self.keys.apply)
        self._signalled: set[asyncio.Task] = set()
        self.usage = usage  # per-tenant records: read, flushed and closed here

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/admin/reload", self.reload)
        app.router.add_get("/admin/config", self.config)
        app.router.add_post("/admin/backends", self.add_backend)
        app.router.add_post("/admin/backends/{id}/drain", self.drain_backend)
        app.router.add_post("/admin/backends/{id}/undrain", self.undrain_backend)
        app.router.add_delete("/admin/backends/{id}", self.remove_backend)
        app.router.add_get("/admin/keys", self.list_keys)
        app.router.add_post("/admin/keys", self.add_key)
        app.router.add_delete("/admin/keys/{sha256}", self.revoke_key)
        self.usage.add_routes(app)  # GET /admin/usage, POST /admin/usage/flush

    async def start(self) -> None:
        await self.keys.start()
        await self.usage.start()

    async def close(self) -> None:
        await self.keys.close()
        await self.reloader.close()
        await self.usage.close()  # the last flush, before the router closes Redis

    def reload_signal(self) -> None:
        """SIGHUP: reload, its error logged (the running config stays)."""
        task = asyncio.get_running_loop().create_task(self._reload_logged())
        self._signalled.add(task)
        task.add_done_callback(self._signalled.discard)

    async def _reload_logged(self) -> None:
        with contextlib.suppress(ConfigError):  # logged and counted already
            await self._reload("signal", "SIGHUP")

    async def reload(self, request: web.Request) -> web.Response:
        try:
            done = await self._reload("http", f"POST /admin/reload from {request.remote}")
        except ConfigError as exc:
            return error_response(400, clip(str(exc), 2000), code="reload_refused")
        return web.json_response(done)

    async def _reload(self, via: str, asked: str) -> dict:
        """A reload, logged and counted however it was asked for (ConfigError when it was
        refused: the running config stays)."""
        try:
            done = await self.reloader.reload()
        except ConfigError as exc:
            log.error("%s: reload refused, the running config stays: %s", asked, exc)
            self.count_reload("refused", via)
            raise
        log.info("%s: reloaded %s", asked, done["reloaded"])
        self.count_reload("applied", via)
        return done

    async def config(self, _request: web.Request) -> web.Response:
        body = redacted(self.router.config.model_dump(mode="json"))
        return web.json_response(body)

    async def add_backend(self, request: web.Request) -> web.Response:
        try:
            backend = BackendConfig.model_validate(await json_body(request))
            self.reloader.add(backend)
        except ValidationError as exc:
            return invalid(exc, "bad_backend")
        except (ValueError, ConfigError) as exc:
            return error_response(400, clip(str(exc), 1000), code="bad_backend")
        return web.json_response({"added": backend.backend_id}, status=201)

    async def drain_backend(self, request: web.Request) -> web.Response:
        return self._drain(request.match_info["id"], remove=False)

    async def undrain_backend(self, request: web.Request) -> web.Response:
        """Back into rotation after `drain` (a drain survives reloads until this)."""
        backend_id = request.match_info["id"]
        try:
            self.reloader.undrain(backend_id)
        except KeyError:
            message = (
                f"no static backend {clip(backend_id)!r} to undrain (one being removed is "
                "added again with POST /admin/backends; discovered ones undrain via agents)"
            )
            return error_response(404, message, code="backend_not_found")
        backend = self.router.scheduler.backends.get(backend_id)
        return web.json_response(
            {"id": backend_id, "state": backend.state.value, "in_flight": backend.in_flight}
        )

    async def remove_backend(self, request: web.Request) -> web.Response:
        return self._drain(request.match_info["id"], remove=True)

    def _drain(self, backend_id: str, *, remove: bool) -> web.Response:
        try:
            self.reloader.drain(backend_id, remove=remove)
        except KeyError:
            message = f"no static backend {clip(backend_id)!r} (discovered ones drain via agents)"
            return error_response(404, message, code="backend_not_found")
        in_flight = self.router.scheduler.backends.get(backend_id).in_flight
        state = "removing" if remove else "draining"
        return web.json_response({"id": backend_id, "state": state, "in_flight": in_flight})

    async def list_keys(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"keys": self.keys.describe(), "shared": self.keys.redis is not None}
        )

    async def add_key(self, request: web.Request) -> web.Response:
        try:
            key = key_from_body(await json_body(request))
        except ValidationError as exc:
            return invalid(exc, "bad_key")
        except ValueError as exc:
            return error_response(400, clip(str(exc), 1000), code="bad_key")
        if problem := key_problem(key, *self.router.config.key_context()):
            field, why = problem
            return error_response(400, f"{field}: {why}", param=field, code="bad_key")
        try:
            await self.keys.add(key)
        except KeyNotShared as exc:
            return error_response(503, str(exc), code="key_not_shared")
        return web.json_response({"added": key.sha256, "tenant": key.tenant}, status=201)

    async def revoke_key(self, request: web.Request) -> web.Response:
        digest = request.match_info["sha256"]
        if not DIGEST.match(digest):
            return error_response(
                400, "expected the key's sha256 (64 lowercase hex)", code="bad_key"
            )
        try:
            known = await self.keys.revoke(digest)
        except KeyNotShared as exc:
            return error_response(503, str(exc), code="key_not_shared")
        return web.json_response({"revoked": digest, "was_in_force": known})
