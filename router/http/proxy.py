"""The data plane's entry points: the front stages, then the attempts loop, with the
bookkeeping every request gets (in-flight count, metrics, the admission slot).

Every request ends in exactly one of: a relayed response, an OpenAI-format error, or an
explicit error ending after a body broke; its ledger entry is released on every path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp import web
from gpuroute.router.attempts.exchange import Answer, Exchange
from gpuroute.router.attempts.forward import Forwarder
from gpuroute.router.core.lifetime import Event
from gpuroute.router.front.stages import Front
from gpuroute.router.observe.access import ENDED, RouterAccessLog, forget_exchange
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.usage.tokens import ask_usage

from gpuroute.openai_api import Rejection, error_response
from gpuroute.relay.body import (
    RESPONSE_DROP,
    UPSTREAM_ERRORS,
    ResponseTally,
    cancelled_status,
    forward_headers,
    is_event_stream,
)
from gpuroute.tracing import onward

log = logging.getLogger("gpuroute.router")


class Proxy:
    def __init__(
        self,
        front: Front,
        forwarder: Forwarder,
        metrics: RouterMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.front, self.forwarder, self.clock = front, forwarder, clock
        self.access = RouterAccessLog(front.config.access_log)  # one line a request
        self.active = 0  # requests in a handler (the drain waits for none)
        self.idle = asyncio.Event()
        self.idle.set()
        metrics.in_flight.set_function(lambda: self.active)  # read at scrape time

    # -- entry points ----------------------------------------------------------------------
    async def openai(self, request: web.Request) -> web.StreamResponse:
        """One try/finally holds every count: a client that hangs up cancels this task at
        any await, and the in-flight gauge and the drain's idle event must still come back (a
        second try after an await is skipped by it)."""
        route = request.path
        arrival = self.clock()
        self.active += 1
        self.idle.clear()
        status = 499  # what a cancelled request (the client gone) is counted as
        try:
            try:
                response = await self._openai(request, route, arrival)
            except Exception:  # a bug must still answer in OpenAI's format, never a bare 500
                log.exception("internal error on %s", route)
                response = error_response(500, "internal router error", code="internal_error")
            status = response.status
            return response
        except asyncio.CancelledError as cancelled:
            status = cancelled_status(cancelled)
            raise
        finally:
            self.active -= 1
            elapsed = self.clock() - arrival
            self.forwarder.requests.answered(request, route, status, elapsed)
            if self.active == 0:
                self.idle.set()
            self.access.answered(request, route, status, elapsed)
            forget_exchange(request)

    async def _openai(self, request: web.Request, route: str, arrival: float) -> web.StreamResponse:
        try:
            exchange = await self.front.admit(request, route, arrival)
        except Rejection as rejection:
            return rejection.response()
        life = exchange.life
        ending = Event.CANCEL  # unless it ends otherwise: its client left
        try:
            exchange.headers = self.forwarder.engine_headers(request, exchange.read)
            parsed = exchange.parsed
            strip = ask_usage(route, parsed.stream, parsed.body)
            continuable, ids = self.forwarder.continuer.prepare(route, parsed.stream, parsed.body)
            exchange.body, exchange.edited = parsed.body, strip or ids or parsed.edited
            exchange.strip_usage, exchange.strip_token_ids = strip, ids
            exchange.continuable = continuable
            response = await self.forwarder.attempts(exchange)
            ending = exchange.ending
            return response
        except Rejection as rejection:  # SLO-aware admission refused it while held
            ending = Event.REFUSE
            status, code = rejection.status, rejection.code
            self.forwarder.decisions.refused(
                life.request_id, status, code, rejection.message, life.info, emit=life.sampled
            )
            return rejection.response()
        except Exception:
            ending = Event.FAIL
            raise
        finally:
            self.front.end(exchange, ending)
            request[ENDED] = exchange  # for its access-log line

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        """An allow-listed path (config `passthrough_paths`): the same key, quota and queue
        checks as the OpenAI routes, then the ready backend with the fewest requests booked
        (the scheduler's `route_unparsed`), unretried."""
        arrival, status = self.clock(), 499  # 499: the client left
        try:
            response = await self._passthrough(request)
            status = response.status
            return response
        except Exception:
            status = 500
            raise
        finally:
            self.access.answered(request, request.path, status, self.clock() - arrival)
            forget_exchange(request)

    async def _passthrough(self, request: web.Request) -> web.StreamResponse:
        try:
            admitted = await self.front.admit_other(request)
        except Rejection as rejection:
            return rejection.response()
        ending = Event.CANCEL
        try:
            response = await self._pass(request, admitted)
            ending = Event.FINISH if admitted.answer is not None else Event.FAIL
            return response
        finally:
            self.front.end(admitted, ending)
            request[ENDED] = admitted  # for its access-log line

    async def _pass(self, request: web.Request, admitted: Exchange) -> web.StreamResponse:
        """Forward as it came; what came back is its answer (its usage settles the tenant's
        token charge, as on the OpenAI routes)."""
        backend = self.forwarder.scheduler.route_unparsed(admitted.life)
        if backend is None:
            return error_response(503, "no backend is ready", code="no_backend")
        admitted.life.move(Event.PLACE)  # booked there until its lifetime closes
        session = self.forwarder.session
        assert session is not None
        try:
            upstream = await session.request(
                request.method,
                self.forwarder.urls[backend.backend_id],
                request.path_qs,
                admitted.raw,
                self.forwarder.engine_headers(request, admitted.read) | onward(request, 0),
            )
            async with upstream:
                body = await upstream.read()
                headers = forward_headers(upstream.headers.items(), RESPONSE_DROP)
                tally = ResponseTally()
                tally.add(body)
                streamed = is_event_stream(upstream)
                admitted.answer = Answer(upstream.status, streamed, tally, backend.backend_id)
                return web.Response(status=upstream.status, body=body, headers=headers)
        except UPSTREAM_ERRORS as exc:
            log.warning("passthrough to %s failed: %r", backend.backend_id, exc)
            return error_response(502, "the backend could not be reached", code="upstream_error")
