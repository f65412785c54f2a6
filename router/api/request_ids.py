"""Each request's own id: the router's, unique per request (answered, logged, the base of
each engine attempt's id), with the client's `x-request-id` kept beside it."""

from __future__ import annotations

from aiohttp import web
from gpuroute.router.core.lifetime import RequestLifetime

from gpuroute.request_context import REQUEST_ID as LOG_REQUEST_ID
from gpuroute.tracing import CLIENT_REQUEST_ID, REQUEST_ID, new_request_id

# every answer is named by gpuroute/tracing.py's name_request (installed with the tracing)
__all__ = ["CLIENT_REQUEST_ID", "named", "new_request_id", "own_id"]


def own_id(request: web.Request) -> str:
    """The request's id: always the router's own, answered and logged (a client's id is
    any tenant's to reuse, and `/admin/explain` would mix two tenants' requests under
    it). The tracing middleware gives it on every route (gpuroute/tracing.py), keeping the
    client's `x-request-id`, when it sent a usable one, as `client_request_id`; one is made
    here for a request that came another way."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = request[REQUEST_ID] = new_request_id()
    LOG_REQUEST_ID.set(rid)
    return rid


def named(request: web.Request, life: RequestLifetime) -> None:
    """The id the request was let in under (its own, suffixed in the unlikely case one in
    flight here carries it already) is the one answered and logged."""
    request[REQUEST_ID] = str(life.request_id)
    LOG_REQUEST_ID.set(str(life.request_id))
