"""Stored responses by id, answered by the router from its store (router/responses_state.py),
so they work on every replica sharing its Redis and outlive the engine that answered:

- `GET /v1/responses/{id}`: the stored response object (`?stream=true`, which replays a
  background response, is refused: there are none here);
- `DELETE /v1/responses/{id}`: `{"id", "object": "response.deleted", "deleted": true}`;
- `POST /v1/responses/{id}/cancel`: only background responses can be cancelled, and
  gpuroute runs none, so a stored (complete) response is refused with 400, as vLLM and
  OpenAI refuse to cancel a response that was not created in background mode.

Each requires a key where keys are required (the tenant gate's `identify`), and a tenant
sees only its own: another tenant's id is answered 404 exactly as an unknown one."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aiohttp import web
from gpuroute.router.quotas import KeyPolicy
from gpuroute.router.responses_state import ResponsesState
from gpuroute.router.responses_store import StoreUnavailable

from gpuroute.headers import interpreted
from gpuroute.openai_api import Rejection

Identify = Callable[[Mapping[str, str]], KeyPolicy]
BY_ID = "/v1/responses/{response_id}"
NOT_CANCELLABLE = (
    "Cannot cancel a synchronous response: only background responses can be cancelled, "
    "and gpuroute does not run background mode"
)


class ResponsesRoutes:
    def __init__(self, state: ResponsesState, identify: Identify) -> None:
        self.state, self.identify = state, identify

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(BY_ID, self.retrieve)
        app.router.add_delete(BY_ID, self.delete)
        app.router.add_post(BY_ID + "/cancel", self.cancel)

    def _tenant(self, request: web.Request) -> str:
        return self.identify(interpreted(request.headers.items())).tenant

    async def retrieve(self, request: web.Request) -> web.Response:
        try:
            tenant = self._tenant(request)
            if request.query.get("stream", "false").lower() == "true":
                raise Rejection(400, "stream=true replays background responses, which gpuroute "
                                "does not run", param="stream")  # fmt: skip
            entry = await self.state.find(tenant, request.match_info["response_id"])
        except Rejection as rejection:
            return rejection.response()
        return web.json_response(entry.response)

    async def delete(self, request: web.Request) -> web.Response:
        rid = request.match_info["response_id"]
        try:
            tenant = self._tenant(request)
            await self.state.find(tenant, rid)  # 404 (or 503) as a GET would answer
            await self.state.store.delete(tenant, rid)
        except Rejection as rejection:
            return rejection.response()
        except StoreUnavailable:  # Redis went between the read and the delete
            return Rejection(503, "stored responses cannot be changed now; retry shortly",
                             code="store_unavailable").response()  # fmt: skip
        return web.json_response({"id": rid, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            tenant = self._tenant(request)
            await self.state.find(tenant, request.match_info["response_id"])
        except Rejection as rejection:
            return rejection.response()
        return Rejection(400, NOT_CANCELLABLE, param="response_id").response()


def add_responses_routes(
    app: web.Application, state: ResponsesState | None, identify: Identify
) -> None:
    """The by-id routes, where the router keeps the state; stores still on their way land
    before the app's other cleanups (which close the Redis client)."""
    if state is None:
        return
    ResponsesRoutes(state, identify).add_routes(app)

    async def closing(_app: web.Application) -> None:
        await state.close()

    app.on_cleanup.append(closing)
