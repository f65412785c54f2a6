"""A stream whose engine broke mid-answer goes on on another backend (gpuroute/continuation.py
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
from gpuroute.router.api_formats import stream_error_event
from gpuroute.router.attempt_failure import UpstreamFailed
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.lifetime import Event
from gpuroute.router.core.retry import FailureKind
from gpuroute.router.exchange import Exchange
from prometheus_client import Counter

from gpuroute.continuation import (
    Broken,
    ContinuationConfig,
    Splice,
    ask_token_ids,
    budget_spent,
    continuation_body,
    finish_events,
    read_broken,
    sent_as,
    static_reason,
)
from gpuroute.relay import (
    ClientWriter,
    Relayed,
    RelayEnd,
    ResponseTally,
    end,
    end_truncated,
    is_event_stream,
    relay_body,
)
from gpuroute.tracing import REQUEST_ID_HEADER, engine_request_id
from gpuroute.upstream import UpstreamResponse

if TYPE_CHECKING:
    from gpuroute.router.forward import Forwarder

log = logging.getLogger("gpuroute.router.continuation")
BROKEN_MESSAGE = "the backend failed mid-stream"


class Refused(Exception):
    """The backend placed to continue a stream answered with an error, not a stream."""


class SplicedContent:
    """The continuing engine's body as relay_body reads it: rewritten by the splice."""

    __slots__ = ("content", "splice")

    def __init__(self, content, splice: Splice) -> None:
        self.content, self.splice = content, splice

    async def readany(self) -> bytes:
        while True:
            chunk = await self.content.readany()
            if not chunk:
                return self.splice.flush()
            if out := self.splice.feed(chunk):
                return out


class SplicedUpstream:
    """The continuing engine's answer as relay_body reads a stream: its headers, its body
    spliced."""

    __slots__ = ("content", "headers")

    def __init__(self, upstream: UpstreamResponse, splice: Splice) -> None:
        self.headers = upstream.headers
        self.content = SplicedContent(upstream.content, splice)


class StreamContinuer:
    """Continuations for one router's forwarder."""

    def __init__(self, forwarder: Forwarder, config: ContinuationConfig) -> None:
        self.forwarder, self.config = forwarder, config
        self.counted = Counter(
            "gpuroute_stream_continuations",
            "Streams whose engine broke mid-answer: continued on another backend, or ended "
            "with the error event and why not (n, logprobs, seed, tool_calls, no_backend, ...).",
            ["reason", "outcome"],
            registry=forwarder.metrics.registry,
        )
        self.prefill = Counter(
            "gpuroute_stream_continuation_prefill_tokens",
            "Prompt tokens sent to continue broken streams (the prompt and the text so far, "
            "prefilled again where the stream goes on): the GPU work continuations cost.",
            registry=forwarder.metrics.registry,
        )

    def ask_token_ids(self, route: str, stream: bool, body: dict | None) -> bool:
        """Ask the engine for a stream's token ids where it may have to be continued (True:
        the client did not ask, so they are stripped from what it receives)."""
        if not (stream and self.config.enabled and self.config.token_ids):
            return False
        return static_reason(route, body) is None and ask_token_ids(body)

    def record(self, exchange: Exchange, tally: ResponseTally) -> None:
        """Keep the stream's chunks while it may have to be continued."""
        if self.config.enabled and static_reason(exchange.route, exchange.body) is None:
            tally.kept, tally.keep_up_to = bytearray(), self.config.max_recorded_bytes

    async def go_on(
        self, exchange: Exchange, response: web.StreamResponse, backend: Backend, relayed: Relayed
    ) -> tuple[Relayed, Backend]:
        """Continue the broken stream `relayed` (from `backend`) until a continuation ends
        it some other way, or none can go on (then the explicit error ends it). The
        backend whose stream ended it, and how."""
        tries = 0
        while relayed.end is RelayEnd.UPSTREAM_BROKE:
            if not relayed.streamed:  # a whole answer cut short: relay_body closed it
                self._judge(exchange, backend, relayed.error)
                return relayed, backend
            broken = self._read(relayed.tally, exchange.route)
            if broken is not None and (
                broken.finished or budget_spent(exchange.body or {}, broken)
            ):
                return await self._finish(exchange, response, relayed.tally, broken), backend
            self._judge(exchange, backend, relayed.error)
            if (reason := self._why_not(exchange, relayed.tally, broken, tries)) is not None:
                return await self._give_up(exchange, response, relayed, backend, reason)
            assert broken is not None
            tries += 1
            try:
                went_on = await self._continue(exchange, response, relayed.tally, broken, tries)
            except Refused:
                return await self._give_up(exchange, response, relayed, backend, "refused")
            if went_on is None:
                return await self._give_up(exchange, response, relayed, backend, "no_backend")
            relayed, backend = went_on
            self.counted.labels("engine_broke", "continued").inc()
        return relayed, backend

    def _judge(self, exchange: Exchange, backend: Backend, exc: BaseException | None) -> None:
        """The body broke after the client saw its first bytes: the backend's verdict."""
        forwarder, life = self.forwarder, exchange.life
        forwarder.metrics.stream_errors.labels(backend.backend_id).inc()
        forwarder.decisions.failure(life.info, backend, FailureKind.STREAM.value, emit=life.sampled)
        # a connection that died mid-stream means the engine died; a timeout may not
        fatal = not isinstance(exc, asyncio.TimeoutError)
        forwarder.settle(life, backend, ok=False, fatal=fatal)
        log.warning("stream from %s broke after first byte: %r", backend.backend_id, exc)

    @staticmethod
    def _read(tally: ResponseTally, route: str) -> Broken | None:
        """What the client received, read back (None: it was not kept, or half an event
        reached the client, after which nothing can follow)."""
        kept = tally.kept
        if not kept or not kept.endswith(b"\n\n"):
            return None
        return read_broken(bytes(kept), route)

    def _why_not(
        self, exchange: Exchange, tally: ResponseTally, broken: Broken | None, tries: int
    ) -> str | None:
        """Why the stream cannot go on faithfully (None: it can)."""
        if not self.config.enabled:
            return "disabled"
        if (reason := static_reason(exchange.route, exchange.body)) is not None:
            return reason
        if broken is None:
            return "too_long" if tally.kept is None else "torn_event"
        if tries >= self.config.max_attempts:
            return "attempts"
        if broken.unread:
            return "unreadable"  # events it cannot tell the text of: no faithful splice
        if broken.reasoning:
            return "reasoning"
        if broken.tool_calls:
            return "tool_calls"
        return None

    async def _continue(
        self,
        exchange: Exchange,
        response: web.StreamResponse,
        tally: ResponseTally,
        broken: Broken,
        tries: int,
    ) -> tuple[Relayed, Backend] | None:
        """One continuation placed, sent and relayed (None: no backend would take it)."""
        forwarder, life = self.forwarder, exchange.life
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
                return await self._send(exchange, response, tally, broken, backend, expected)
            except UpstreamFailed as failure:
                forwarder.failed_attempt(exchange, backend, failure.kind)
                if not await forwarder.retry_after(life, failure.kind):
                    return None
            finally:
                life.attempts.end(forwarder.budget)
        return None

    async def _send(
        self,
        exchange: Exchange,
        response: web.StreamResponse,
        tally: ResponseTally,
        broken: Broken,
        backend: Backend,
        expected: float,
    ) -> tuple[Relayed, Backend]:
        """The continuation sent to `backend` and its stream spliced into the client's;
        Refused when its engine answers with an error instead of a stream."""
        forwarder, life = self.forwarder, exchange.life
        upstream, first = await forwarder.first_bytes(exchange, backend, expected)
        self.prefill.inc(life.info.prompt_tokens)  # its prefill is done again there
        if upstream.status >= 400 or not is_event_stream(upstream):
            upstream.close()  # its engine refused it (a context too long, say): healthy
            forwarder.watch.forget(life)
            forwarder.settle(life, backend, ok=True)
            raise Refused(f"status {upstream.status}")
        try:
            return await self._relay(exchange, response, tally, broken, upstream, first), backend
        finally:
            upstream.finish()

    async def _relay(
        self,
        exchange: Exchange,
        response: web.StreamResponse,
        tally: ResponseTally,
        broken: Broken,
        upstream: UpstreamResponse,
        first: bytes,
    ) -> Relayed:
        forwarder, life = self.forwarder, exchange.life
        splice = Splice(broken, as_chat=exchange.continuation_route != exchange.route)

        def first_written() -> None:
            now = forwarder.clock()
            exchange.resumed = (now, broken.tokens)  # its engine is judged on what follows
            life.move(Event.FIRST_BYTE)
            forwarder.scheduler.first_token(life, now, now - exchange.dispatched)
            forwarder.offer_room()
            forwarder.watch.streaming(life, tally)

        return await relay_body(
            exchange.request,
            response,
            SplicedUpstream(upstream, splice),  # type: ignore[arg-type]
            first=splice.feed(first),
            on_first_write=first_written,
            broken_message=lambda exc: BROKEN_MESSAGE,
            tally=tally,
            write_timeout_s=forwarder.write_timeout_s,
            end_broken=False,
        )

    async def _finish(
        self, exchange: Exchange, response: web.StreamResponse, tally: ResponseTally, broken: Broken
    ) -> Relayed:
        """A stream whose engine broke after its last token: its finish (`length` where its
        cap was spent and none came) and [DONE], as the engine would have ended it."""
        reason = "finished" if broken.finished else "length"
        self.counted.labels(reason, "ended").inc()
        last = finish_events(broken, exchange.route, None if broken.finished else "length")
        client = ClientWriter(exchange.request, response, self.forwarder.write_timeout_s)
        return await end(client, tally, True, last)

    async def _give_up(
        self,
        exchange: Exchange,
        response: web.StreamResponse,
        relayed: Relayed,
        backend: Backend,
        reason: str | None,
    ) -> tuple[Relayed, Backend]:
        """The explicit error event: a truncated answer must never look complete."""
        reason = reason or "unknown"
        self.counted.labels(reason, "ended").inc()
        log.info("request %s: stream not continued (%s)", exchange.life.request_id, reason)
        client = ClientWriter(exchange.request, response, self.forwarder.write_timeout_s)
        error_event = stream_error_event(exchange.route)
        await end_truncated(exchange.request, client, True, BROKEN_MESSAGE, error_event)
        return relayed, backend
