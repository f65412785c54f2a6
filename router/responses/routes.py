"""Stored responses by id, answered by the router from its store (router/responses/state.py),
so they work on every replica sharing its Redis and outlive the engine that answered:

- `GET /v1/responses/{id}`: the stored response object (`?stream=true`, which replays a
  background response, is refused: there are none here);
- `DELETE /v1/responses/{id}`: `{"id", "object": "response.deleted", "deleted": true}`;
- `POST /v1/responses/{id}/cancel`: only background responses can be cancelled, and
  gpuroute runs none, so a stored (complete) response is refused with 400, as vLLM and
  OpenAI refuse to cancel a response that was not created in background mode.

Each requires a key where keys are required (the tenant gate's `identify`), and a tenant
sees only its own: another tenant's id is answered 404 exactly as an unknown one. Each
counts against the key's per-minute requests and in-flight cap (never its tokens: the
tenant gate's `lookup`), and each writes its access-log line, refusals included."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from gpuroute.router.front.tenant import TenantGate
from gpuroute.router.observe.access import TENANT, RouterAccessLog
from gpuroute.router.responses.state import ResponsesState
from gpuroute.router.responses.store import StoreUnavailable

from gpuroute.headers import interpreted
from gpuroute.openai_api import Rejection

Handler = Callable[[web.Request, str], Awaitable[web.Response]]
BY_ID = "/v1/responses/{response_id}"
NOT_CANCELLABLE = (
    "Cannot cancel a synchronous response: only background responses can be cancelled, "
    "and gpuroute does not run background mode"
)


class ResponsesRoutes:
    def __init__(self, state: ResponsesState, tenants: TenantGate, access: RouterAccessLog) -> None:
        self.state, self.tenants, self.access = state, tenants, access

    def add_routes(self, app: web.Application) -> None:
        for method, path, handler in (
            ("GET", BY_ID, self.retrieve),
            ("DELETE", BY_ID, self.delete),
            ("POST", BY_ID + "/cancel", self.cancel),
        ):  # the access log names the route by its template, never by the id
            app.router.add_route(method, path, self._limited(handler, path))

    def _limited(
        self, handler: Handler, route: str
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """`handler` for the caller's tenant, within its key's per-minute requests and
        in-flight cap, with its access-log line whatever it answers."""

        async def limited(request: web.Request) -> web.Response:
            started, status = time.monotonic(), 499  # 499: the client left
            try:
                response = await self._answer(request, handler)
                status = response.status
                return response
            finally:
                self.access.answered(request, route, status, time.monotonic() - started)

        return limited

    async def _answer(self, request: web.Request, handler: Handler) -> web.Response:
        try:
            key = self.tenants.identify(interpreted(request.headers.items()))
            request[TENANT] = key.tenant
            async with self.tenants.lookup(key):
                return await handler(request, key.tenant)
        except Rejection as rejection:
            return rejection.response()

    async def retrieve(self, request: web.Request, tenant: str) -> web.Response:
        if request.query.get("stream", "false").lower() == "true":
            raise Rejection(400, "stream=true replays background responses, which gpuroute "
                            "does not run", param="stream")  # fmt: skip
        entry = await self.state.find(tenant, request.match_info["response_id"])
        return web.json_response(entry.response)

    async def delete(self, request: web.Request, tenant: str) -> web.Response:
        rid = request.match_info["response_id"]
        await self.state.find(tenant, rid)  # 404 (or 503) as a GET would answer
        try:
            await self.state.store.delete(tenant, rid)
        except StoreUnavailable:  # Redis went between the read and the delete
            raise Rejection(503, "stored responses cannot be changed now; retry shortly",
                            code="store_unavailable") from None  # fmt: skip
        return web.json_response({"id": rid, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: web.Request, tenant: str) -> web.Response:
        await self.state.find(tenant, request.match_info["response_id"])
        raise Rejection(400, NOT_CANCELLABLE, param="response_id")


def add_responses_routes(
    app: web.Application,
    state: ResponsesState | None,
    tenants: TenantGate,
    access: RouterAccessLog,
) -> None:
    """The by-id routes, where the router keeps the state; stores still on their way land
    before the app's other cleanups (which close the Redis client)."""
    if state is None:
        return
    ResponsesRoutes(state, tenants, access).add_routes(app)

    async def closing(_app: web.Application) -> None:
        await state.close()

    app.on_cleanup.append(closing)
