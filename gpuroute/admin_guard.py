"""Who may read a tier's admin routes. `/metrics` and `/admin/*` show the fleet's topology
(backend addresses, regions, load), so off loopback they need the operator's admin token
(`Authorization: Bearer <admin_token>`); `/healthz` and `/readyz` stay open for load
balancers, and `/metrics` too where the operator says so (`admin_metrics_open`).

Config refuses an admin listener off loopback without a token: an admin port on 0.0.0.0
(as the Terraform templates bind it, for the load balancer's /readyz) is otherwise open to
anyone who can reach it."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web
from pydantic import model_validator

from gpuroute.auth import AuthError, bearer
from gpuroute.config import ListenConfig, StrictModel
from gpuroute.headers import interpreted
from gpuroute.openai_api import Rejection, error_response
from gpuroute.secrets import check_forms, read_secret

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminAccess(StrictModel):
    """The keys a tier with admin routes takes (router, global tier)."""

    admin_token: str | None = None
    admin_token_file: str | None = None
    admin_token_env: str | None = None
    admin_metrics_open: bool = False  # /metrics without the token (a scraper that has none)

    @model_validator(mode="after")
    def _admin_token_forms(self) -> AdminAccess:
        check_forms(self, ("admin_token",))
        return self

    @property
    def admin_token_set(self) -> bool:
        forms = (self.admin_token, self.admin_token_file, self.admin_token_env)
        return any(f is not None for f in forms)


def admin_placement(
    listen: ListenConfig, on_public: bool, admin_listen: ListenConfig, access: AdminAccess
) -> None:
    """Admin routes join the public listener only when it is bound to loopback and the
    operator asked for it; an admin listener off loopback needs a token."""
    if on_public and not listen.loopback:
        raise ValueError(
            "admin_on_public_listener: allowed only while listen.host is a loopback "
            f"address (it is {listen.host!r}); use admin_listen instead"
        )
    if not on_public and not admin_listen.loopback and not access.admin_token_set:
        raise ValueError(
            f"admin_listen.host {admin_listen.host!r} is not loopback: set admin_token (or "
            "admin_token_file, admin_token_env); /metrics and /admin/* show the fleet"
        )


Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def admin_guards(access: AdminAccess, where: str) -> list[Middleware]:
    """The middleware that asks for the admin token on `/metrics` and `/admin/*` (nothing
    else is touched, so it may sit on a public app that carries admin routes); none when
    no token is configured (the listener is on loopback then, and requests pay nothing)."""
    token = read_secret(access, "admin_token", where)
    if token is None:
        return []
    secret = token.encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        guarded = path.startswith("/admin") or (
            path == "/metrics" and not access.admin_metrics_open
        )
        if not guarded or path in OPEN_PATHS:
            return await handler(request)
        try:
            key = bearer(interpreted(request.headers.items()).get("authorization"))
        except Rejection as rejection:  # a duplicated Authorization, as everywhere
            return rejection.response()
        except AuthError as exc:
            return error_response(exc.status, exc.message, code=exc.code)
        if key is None or not hmac.compare_digest(key.encode(), secret):
            return error_response(401, "admin token required", code="invalid_admin_token")
        return await handler(request)

    return [guard]
