"""Who may use a tier's admin routes: one rule for the router's admin listener (one
process or the `--workers` parent's), the global tier's and the agent's.

`/metrics` and `/admin/*` (the agent: `/status`, `/metrics` and its actions) show the
fleet's topology, and the writes change what is served and to whom. Off loopback they
need the operator's admin token (`Authorization: Bearer <admin_token>`); config refuses
an admin listener off loopback without one. Loopback alone is not enough: a web page in a
browser on the same host can POST a form or a `no-cors` fetch (`text/plain`) to
127.0.0.1, and a page whose name was rebound to 127.0.0.1 reads what it asks for as its
own origin. So, token or not, a request carrying `Origin` is refused (browsers send it on
every cross-site request and every POST; nothing here is a web app), and a write must be
`Content-Type: application/json` (which no page can send cross-site without a CORS grant,
and none is given). Without a token, the caller and the `Host` it names must both be
loopback (`localhost`, 127.x, `[::1]`, with or without a port), on reads and writes.
`/healthz` and `/readyz` stay open to anyone, with any `Host` (load balancers probe with
their own names; they say only up or ready), and `/metrics` skips the token where the
operator says so (`admin_metrics_open`), not the rest of the rule."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from pydantic import model_validator

from gpuroute.auth import AuthError, bearer
from gpuroute.config import ListenConfig, StrictModel, is_loopback
from gpuroute.headers import interpreted
from gpuroute.openai_api import Rejection, error_response
from gpuroute.secrets import check_forms, read_secret

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
READS = frozenset({"GET", "HEAD"})  # every other method is a write and takes JSON
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


class AdminToken(StrictModel):
    """The admin token's keys, in one of its forms, as every tier takes them."""

    admin_token: str | None = None
    admin_token_file: str | None = None
    admin_token_env: str | None = None

    @model_validator(mode="after")
    def _admin_token_forms(self) -> AdminToken:
        check_forms(self, ("admin_token",))
        return self

    @property
    def admin_token_set(self) -> bool:
        forms = (self.admin_token, self.admin_token_file, self.admin_token_env)
        return any(f is not None for f in forms)


class AdminAccess(AdminToken):
    """The keys a tier with admin routes on a fleet takes (router, global tier)."""

    admin_metrics_open: bool = False  # /metrics without the token (a scraper that has none)


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
    if not on_public:
        token_off_loopback(
            admin_listen.host, access, "admin_listen", "; /metrics and /admin/* show the fleet"
        )


def token_off_loopback(host: str, access: AdminToken, key: str, why: str) -> None:
    """An admin listener (config `key`, on `host`) off loopback needs the token: without one
    the guard answers only loopback callers, and `why` says what it would leave open."""
    if not is_loopback(host) and not access.admin_token_set:
        raise ValueError(
            f"{key}.host {host!r} is not loopback: set admin_token (or "
            f"admin_token_file, admin_token_env){why}"
        )


@dataclass(frozen=True)
class AdminGuard:
    """The rule above for one listener: `token` (None: a loopback listener without one)
    and `token_free`, the requests that need no token (still from no web page)."""

    token: str | None
    token_free: Callable[[web.Request], bool]

    def refusal(self, request: web.Request) -> web.Response | None:
        """None when the request may go on; else the 401, 403 or 415 that says why."""
        if "Origin" in request.headers:
            message = "admin routes do not answer web pages: a request with Origin is refused"
            return error_response(403, message, code="cross_origin_refused")
        if self.token is None and (why := not_loopback(request)) is not None:
            return error_response(403, why, code="host_not_loopback")
        if self.token is not None and not self.token_free(request):
            refused = token_refusal(request, self.token)
            if refused is not None:
                return refused
        if request.method not in READS and request.content_type != "application/json":
            message = f"admin {request.method} takes Content-Type: application/json"
            return error_response(415, message, code="json_required")
        return None

    def middleware(self, covers: Callable[[str], bool]) -> Middleware:
        """The guard on the paths `covers` says (nothing else is touched, so it may sit on
        a public app that carries admin routes)."""

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            if covers(request.path) and (refused := self.refusal(request)) is not None:
                return refused
            return await handler(request)

        return guard


def not_loopback(request: web.Request) -> str | None:
    """Why a tokenless listener does not answer this caller (None: it does): the peer
    and the one `Host` it names must be loopback."""
    if request.remote is None or not is_loopback(request.remote):
        return "without admin_token, admin routes answer only callers on loopback"
    hosts = request.headers.getall("Host", [])
    if len(hosts) != 1 or not is_loopback(host_name(hosts[0]).lower()):
        return (
            "without admin_token, admin routes answer only a loopback Host "
            "(localhost, 127.0.0.1, [::1]): a name rebound to 127.0.0.1 is refused"
        )
    return None


def host_name(host: str) -> str:
    """The name in a Host header, without its port (`[::1]:7071` -> `::1`)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def token_refusal(request: web.Request, token: str) -> web.Response | None:
    """None when the request bears the admin token; else the 401 (or a duplicated
    Authorization's 400, as everywhere)."""
    try:
        key = bearer(interpreted(request.headers.items()).get("authorization"))
    except Rejection as rejection:
        return rejection.response()
    except AuthError as exc:
        return error_response(exc.status, exc.message, code=exc.code)
    if key is None or not hmac.compare_digest(key.encode(), token.encode()):
        return error_response(401, "admin token required", code="invalid_admin_token")
    return None


def admin_guards(access: AdminAccess, where: str) -> list[Middleware]:
    """The router's and the global tier's guard, on `/metrics` and `/admin/*`."""
    guard = AdminGuard(
        read_secret(access, "admin_token", where),
        lambda request: request.path == "/metrics" and access.admin_metrics_open,
    )

    def covers(path: str) -> bool:
        return path.startswith("/admin") or path == "/metrics"

    return [guard.middleware(covers)]


def host_admin_guards(token: str | None) -> list[Middleware]:
    """The agent's guard (a listener that is all admin): every path but /healthz and
    /readyz, reads (one host's status and metrics) without the token, actions with it."""
    guard = AdminGuard(token, lambda request: request.method in READS)
    return [guard.middleware(lambda path: path not in OPEN_PATHS)]
