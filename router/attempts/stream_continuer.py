"""A stream whose engine broke mid-answer goes on on another backend (gpuroute/continuation/text.py
says what is sent and how it is spliced): the broken attempt is judged as any broken
stream is, the continuation is placed by the scheduler like any request (its prompt now
holds the text so far, whose prefill is redone there), and its stream is relayed into
the client's, which never closed. A stream that cannot be continued faithfully, or has
nowhere to go, ends with the explicit error event as before."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import orjson
from aiohttp import web
from gpuroute.router.api.formats import stream_error_event
from gpuroute.router.attempts.exchange import Exchange
from gpuroute.router.attempts.failure import UpstreamFailed
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.lifetime import Event
from gpuroute.router.core.retry import FailureKind
from gpuroute.router.observe.tracing_spans import continuation

from gpuroute.continuation.relay import BrokenStream, Refused, keep
from gpuroute.continuation.splice import Splice
from gpuroute.continuation.text import (
    Broken,
    ContinuationConfig,
    continuation_body,
    prepare,
    sent_as,
)
from gpuroute.relay.body import Relayed, ResponseTally, is_event_stream
from gpuroute.tracing import REQUEST_ID_HEADER, engine_request_id
from gpuroute.upstream.client import UpstreamResponse

if TYPE_CHECKING:
    from gpuroute.router.attempts.forward import Forwarder

log = logging.getLogger("gpuroute.router.continuation")
BROKEN_MESSAGE = "the backend failed mid-stream"


class StreamContinuer:
    """Continuations for one router's forwarder."""

    def __init__(self, forwarder: Forwarder, config: ContinuationConfig) -> None:
        self.forwarder, self.config = forwarder, config
        metrics = forwarder.metrics  # counted in router/observe/metrics.py's
        self.counted, self.prefill = metrics.continuations, metrics.continuation_prefill

    def prepare(self, route: str, stream: bool, body: dict | None) -> tuple[bool, bool]:
        """Whether the stream may be continued, and whether its token ids were asked for on
        its client's behalf (gpuroute/continuation/text.py `prepare`)."""
        return prepare(self.config, route, stream, body)

    def record(self, exchange: Exchange, tally: ResponseTally) -> None:
        """Keep the stream's chunks while it may have to be continued."""
        if exchange.continuable:
            keep(self.config, tally)

    async def go_on(
        self, exchange: Exchange, response: web.StreamResponse, backend: Backend, relayed: Relayed
    ) -> tuple[Relayed, Backend]:
        """Continue the broken stream `relayed` (from `backend`) until a continuation ends
        it some other way, or none can go on (then the explicit error ends it). The
        backend whose stream ended it, and how."""
        stream = BackendStream(self, exchange, response, backend)
        return await stream.carry_on(relayed), stream.backend


class BackendStream(BrokenStream):
    """A stream whose engine broke, continued on another backend the scheduler places."""

    NOWHERE, BROKE = "no_backend", "engine_broke"

    def __init__(
        self,
        continuer: StreamContinuer,
        exchange: Exchange,
        response: web.StreamResponse,
        backend: Backend,
    ) -> None:
        forwarder = continuer.forwarder
        super().__init__(
            exchange.request,
            response,
            exchange.route,
            exchange.body,
            continuer.config,
            forwarder.write_timeout_s,
            stream_error_event(exchange.route),
        )
        self.continuer, self.forwarder = continuer, forwarder
        self.exchange, self.backend = exchange, backend

    def count(self, reason: str, outcome: str) -> None:
        self.continuer.counted.labels(reason, outcome).inc()

    def message(self) -> str:
        return BROKEN_MESSAGE

    def broke(self, error: BaseException | None) -> None:
        """The body broke after the client saw its first bytes: the backend's verdict."""
        forwarder, life, backend = self.forwarder, self.exchange.life, self.backend
        forwarder.metrics.stream_errors.labels(backend.backend_id).inc()
        forwarder.decisions.failure(life.info, backend, FailureKind.STREAM.value, emit=life.sampled)
        # a connection that died mid-stream means the engine died; a timeout may not
        fatal = not isinstance(error, asyncio.TimeoutError)
        forwarder.settle(life, backend, ok=False, fatal=fatal)
        log.warning("stream from %s broke after first byte: %r", backend.backend_id, error)

    @continuation
    async def attempt(self, tally: ResponseTally, broken: Broken, tries: int) -> Relayed | None:
        """One continuation placed, sent and relayed (None: no backend would take it)."""
        forwarder, exchange = self.forwarder, self.exchange
        life = exchange.life
        before = 0 if exchange.resumed is None else exchange.resumed[1]
        forwarder.loop.continued(life, broken.tokens - before)  # what its prompt lacks yet
        body = continuation_body(exchange.body or {}, exchange.route, broken)
        exchange.continuation_route = sent_as(exchange.route, exchange.body or {}, broken)
        while (backend := await forwarder.place(life, None)) is not None:
            body["model"] = life.model  # the model placed (a fallback's, if it came to that)
            exchange.continuation = orjson.dumps(body)
            rid = engine_request_id(life.request_id, life.attempts.count + tries)
            exchange.headers[REQUEST_ID_HEADER] = rid
            expected = forwarder.watch.started(life, backend)
            exchange.dispatched = forwarder.clock()
            life.attempts.start(forwarder.budget)  # a retry counts against the budget
            try:
                return await self._send(tally, broken, backend, expected)
            except UpstreamFailed as failure:
                forwarder.failed_attempt(exchange, backend, failure.kind)
                if not await forwarder.retry_after(life, failure.kind):
                    return None
            finally:
                life.attempts.end(forwarder.budget)
        return None

    async def _send(
        self, tally: ResponseTally, broken: Broken, backend: Backend, expected: float
    ) -> Relayed:
        """The continuation sent to `backend` and its stream spliced into the client's;
        Refused when its engine answers with an error instead of a stream."""
        forwarder, exchange = self.forwarder, self.exchange
        life = exchange.life
        upstream, first = await forwarder.first_bytes(exchange, backend, expected)
        self.continuer.prefill.inc(life.info.prompt_tokens)  # its prefill is done again there
        if upstream.status >= 400 or not is_event_stream(upstream):
            upstream.close()  # its engine refused it (a context too long, say): healthy
            forwarder.watch.forget(life)
            forwarder.settle(life, backend, ok=True)
            raise Refused(f"status {upstream.status}")
        self.backend = backend
        try:
            return await self._relay(upstream, tally, broken, first)
        finally:
            upstream.finish()

    async def _relay(
        self, upstream: UpstreamResponse, tally: ResponseTally, broken: Broken, first: bytes
    ) -> Relayed:
        forwarder, exchange = self.forwarder, self.exchange
        life = exchange.life

        def first_written() -> None:
            now = forwarder.clock()
            exchange.resumed = (now, broken.tokens)  # its engine is judged on what follows
            life.move(Event.FIRST_BYTE)
            forwarder.scheduler.first_token(life, now, now - exchange.dispatched)
            forwarder.offer_room()
            forwarder.watch.streaming(life, tally)

        as_chat = exchange.continuation_route != exchange.route
        splice = Splice(broken, as_chat=as_chat, body=exchange.body)
        return await self.relay(upstream, tally, splice, first, first_written)
