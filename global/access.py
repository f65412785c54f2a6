"""The global tier's access-log line (gpuroute/access_log.py): a middleware around the API
routes, so the forwarding code keeps one line for it (what it read of the request)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiohttp import web

from gpuroute.access_log import AccessLog, AccessLogConfig, ms
from gpuroute.relay.body import cancelled_status
from gpuroute.tracing import CLIENT_REQUEST_ID, REQUEST_ID

# who the request is and what it asked for, as the forwarding code read them
ASKED = web.RequestKey("gpuroute.global_asked", tuple)
ARRIVED_AT = web.RequestKey("gpuroute.global_arrived_at", float)
PREPARED_AT = web.RequestKey("gpuroute.global_prepared_at", float)
# the `x-request-id` of the regional router's answer (its own id for the request), as it came
ROUTER_REQUEST_ID = web.RequestKey("gpuroute.global_router_request_id", str)
REGION_HEADER = "x-gpuroute-region"
# a router's id (hex); anything else in the header is not written into a log line
SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def install_access_log(
    app: web.Application,
    config: AccessLogConfig,
    routes: Collection[str],
    log: AccessLog | None = None,
    clock: Callable[[], float] = time.monotonic,
    answered: Callable[[str, int, float, str | None], None] = lambda *_: None,
) -> None:
    """One line per answered request on `routes`, with its first byte's time (when its
    headers went out: a stream's first chunk, a whole answer's only one); `answered(route,
    status, seconds, region)` counts each (the tier's metrics)."""
    log = log if log is not None else AccessLog(config)
    paths = frozenset(routes)

    async def first_byte(request: web.Request, _response: web.StreamResponse) -> None:
        if request.path in paths:
            request[PREPARED_AT] = clock()

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in paths:
            return await handler(request)
        arrival = request[ARRIVED_AT] = clock()
        status, response = 499, None  # 499: the client left
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError as cancelled:
            status = cancelled_status(cancelled)
            raise
        except Exception:
            status = 500
            raise
        finally:
            elapsed = clock() - arrival
            region = response.headers.get(REGION_HEADER) if response is not None else None
            answered(request.path, status, elapsed, region)
            rate = log.sample()
            if rate is not None:
                log.write(fields(request, response, status, elapsed, rate))

    app.middlewares.append(access)
    app.on_response_prepare.append(first_byte)


def fields(
    request: web.Request,
    response: web.StreamResponse | None,
    status: int,
    elapsed: float,
    rate: float,
) -> dict[str, Any]:
    """The line: the request's id is this tier's own (the one answered), beside the
    client's `x-request-id` and the id the regional router gave it (read from the router's
    answer, not ours: ours carries our id once its headers are out)."""
    tenant, model = request.get(ASKED, (None, None))
    headers = response.headers if response is not None else {}
    router_id = request.get(ROUTER_REQUEST_ID, "")
    prepared, arrival = request.get(PREPARED_AT), request.get(ARRIVED_AT)
    if prepared is not None and arrival is not None:
        first: float | None = prepared - arrival
    else:  # a whole answer goes out as the handler returns it (none: no first byte)
        first = None if response is None else elapsed
    return {
        "request_id": request.get(REQUEST_ID),
        "client_request_id": request.get(CLIENT_REQUEST_ID),
        "router_request_id": router_id if SAFE_ID.fullmatch(router_id) else None,
        "route": request.path,
        "status": status,
        "tenant": tenant,
        "model": model,
        "region": headers.get(REGION_HEADER),
        "ttft_ms": ms(first),
        "duration_ms": ms(elapsed),
        "sample_rate": rate,
    }
