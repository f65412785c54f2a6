"""The attempts loop: pick a backend with the core, send, wait for the first bytes, relay.

Before the first bytes reach the client an attempt that fails (refused, reset, timeout, 5xx,
an empty close, or a rescue off a lost or very slow backend) moves to another backend, as
the core's `Attempts` and `RetryBudget` allow; after them a broken body ends as an error
(gpuroute/relay/body.py). The ledger entry is released on every path."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Callable, Mapping

from aiohttp import web
from gpuroute.router.api.formats import stream_error_event
from gpuroute.router.attempts.exchange import NO_BACKEND, Answer, Exchange, answer_headers
from gpuroute.router.attempts.failure import UpstreamFailed, failure_kind
from gpuroute.router.attempts.stream_continuer import (
    BROKEN_MESSAGE,
    FIRST,
    NOWHERE,
    Leg,
    StreamContinuer,
)
from gpuroute.router.attempts.watch import BackendWatch
from gpuroute.router.backends.health_report import report_health
from gpuroute.router.config.router import LimitsConfig
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.health import HealthEvents
from gpuroute.router.core.lifetime import Event, Lifetimes, RequestLifetime
from gpuroute.router.core.placement import AttemptLoop, Step
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.retry import FailureKind, Verdict
from gpuroute.router.core.scheduler import Outcome, Scheduler
from gpuroute.router.core.standby import StandbyRotation
from gpuroute.router.front.slo import SloGate
from gpuroute.router.observe.decision_log import DecisionLog
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.observe.request_metrics import RequestMetrics
from gpuroute.router.observe.tracing_spans import attempt, continuation, first_byte, pick
from gpuroute.router.shared.sessions import SessionStore

from gpuroute.continuation.relay import Refused, relay_spliced
from gpuroute.continuation.text import ContinuationConfig
from gpuroute.continuation.verdict import END, FINISH
from gpuroute.headers import ENGINE_HEADERS, FORWARDED_FOR, forwarded_for, pass_on
from gpuroute.openai_api import error_response
from gpuroute.relay.body import (
    UPSTREAM_ERRORS,
    Relayed,
    RelayedResponse,
    RelayEnd,
    ResponseTally,
    is_event_stream,
    relay_body,
)
from gpuroute.tracing import ONWARD
from gpuroute.upstream import UpstreamPool, UpstreamResponse

log = logging.getLogger("gpuroute.router")
continuation_log = logging.getLogger("gpuroute.router.continuation")


class Forwarder:
    def __init__(
        self,
        scheduler: Scheduler,
        metrics: RouterMetrics,
        watch: BackendWatch,
        decisions: DecisionLog,
        lifetimes: Lifetimes,
        *,
        sessions: SessionStore | None,
        slo: SloGate,
        has_room: Callable[[str], bool],
        clock: Callable[[], float],
        rng: random.Random,
        expose_backend: bool = False,
        engine_key: str | None = None,
        engine_tls: ssl.SSLContext | None = None,
        engine_headers: frozenset[str] = ENGINE_HEADERS,
        continuation: ContinuationConfig | None = None,
        standby: StandbyRotation | None = None,
        urls: dict[str, str],
    ) -> None:
        self.engine_key, self.engine_allowed = engine_key, engine_headers
        self.engine_tls = engine_tls  # None: the system's CAs for https engines
        self.scheduler, self.metrics, self.watch = scheduler, metrics, watch
        self.requests = RequestMetrics(metrics, clock)  # by route and model
        self.expose_backend = expose_backend  # name the backend to clients (tests, benches)
        self.decisions, self.sessions, self.lifetimes = decisions, sessions, lifetimes
        self.has_room, self.clock, self.rng, self.urls = has_room, clock, rng, urls  # id -> URL
        self.budget = lifetimes.budget  # requests in flight and retries running
        self.slo = slo  # classes' attainment; holds predicted misses (predicting policies)
        # the attempts loop the simulator runs too: route, promote standby, hold, retry
        self.loop = AttemptLoop(scheduler, self.budget, slo.queue, standby)
        self.continuer = StreamContinuer(continuation or ContinuationConfig(), metrics)
        self.session: UpstreamPool | None = None  # to the engines; start() opens it
        self.write_timeout_s: float | None = None  # a client behind this long is cut off

    async def start(self, limits: LimitsConfig) -> None:
        self.write_timeout_s = limits.client_write_timeout_s
        # no cookie jar (one engine's cookie never rides on another client's request)
        self.session = UpstreamPool(
            connect_timeout_s=limits.connect_timeout_s,
            first_byte_timeout_s=limits.first_byte_timeout_s,
            idle_timeout_s=limits.idle_timeout_s,
            tls=self.engine_tls,
            on_open=lambda origin, why: self.metrics.upstream_connections.labels(origin, why).inc(),
        )

    def engine_headers(self, request: web.Request, read: Mapping[str, str]) -> dict[str, str]:
        """What an engine gets of the client's headers: the allow-listed ones, with the
        client appended to X-Forwarded-For, and the router's own engine key when one is
        configured (a client's key, cookies and our control headers never)."""
        headers = pass_on(request.headers.items(), self.engine_allowed)
        headers[FORWARDED_FOR] = forwarded_for(read, request.remote)
        headers.update(request.get(ONWARD) or ())  # ids: per attempt (tracing_spans.attempt)
        if self.engine_key is not None:
            headers["authorization"] = f"Bearer {self.engine_key}"
        return headers

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def attempts(self, exchange: Exchange) -> web.StreamResponse:
        """The request's first answer through the attempt runner (`run`). Suspects left
        when no attempt was answered below 500 go unjudged: the request, not they, is the
        likely cause."""
        life = exchange.life
        info = life.info
        ran = await self.run(exchange, FIRST, await self._remembered(info))
        if ran is not None:
            assert exchange.response is not None
            return exchange.response
        exchange.ending = Event.FAIL
        last = exchange.last_failure
        if not life.tried:
            self.decisions.refused(
                info.request_id, 503, "no_backend", last, info, emit=life.sampled
            )
            return error_response(503, NO_BACKEND, code="no_backend")
        # the details are for operators (log, decision log), never for clients
        log.warning("request %s: all attempts failed; last: %s", info.request_id, last)
        self.decisions.refused(
            info.request_id, 502, "upstream_error", last, info, emit=life.sampled
        )
        return error_response(502, "no backend could answer the request", code="upstream_error")

    @continuation
    async def run(
        self, exchange: Exchange, leg: Leg, remembered: str | None = None
    ) -> tuple[Backend, Relayed] | None:
        """The attempt runner, for the first answer and each continuation alike: place,
        then send, first bytes, relay and settle (`_attempt`), a failed attempt retried
        after its backoff while the core's attempts loop (core/placement.py) allows. The
        backend that answered and how its answer ended; None when no backend would take
        it (`exchange.last_failure` says why); a continuation's engine that refused it
        raises Refused."""
        life = exchange.life
        exchange.last_failure = "no backend is available"
        while (backend := await self.place(life, remembered)) is not None:
            if leg.broken is not None:
                self.continuer.placed(exchange, leg, life.model)
            try:
                return backend, await self._attempt(exchange, backend, leg)
            except UpstreamFailed as failure:
                exchange.last_failure = f"backend {backend.backend_id}: {failure}"
                if not await self.retry_after(life, failure.kind):
                    break
        return None

    async def retry_after(self, life: RequestLifetime, kind: FailureKind) -> bool:
        """After a failed attempt: whether another may follow (after its backoff), counted."""
        retry = self.loop.failed(life, kind, self.rng)
        if retry.verdict is Verdict.BUDGET_EXHAUSTED:
            self.metrics.retry_budget_exhausted.inc()
        if retry.go:
            self.metrics.retries.labels(kind.value).inc()
            if retry.delay_s:
                await asyncio.sleep(retry.delay_s)  # jittered backoff, not a synchronisation
        return retry.go

    @pick
    async def place(self, life: RequestLifetime, remembered: str | None) -> Backend | None:
        """A booked backend for this attempt (None: none can take it), each decision, hold
        and refusal written to the decision log."""
        info, attempt = life.info, life.attempts.count
        started, emit = time.perf_counter(), life.sampled
        trace = self.decisions.trace(emit)
        placement = self.loop.route(life, self.clock(), self.rng, remembered, trace)
        self.metrics.decision_timing.observe(time.perf_counter() - started)
        decision = placement.decision
        if decision is None:
            self.decisions.no_backend(info, trace, emit=emit)
            return None
        self.decisions.decision(info, decision, attempt, emit=emit)
        if placement.step is Step.HOLD:
            if all(shed.item is not life for shed in placement.refused):
                self.decisions.held(info, emit=emit)
            decision = await self.slo.hold(life, placement.refused, short=not placement.yielded)
            self.decisions.decision(info, decision, attempt, emit=emit)
        backend = decision.backend
        if self.sessions is not None and info.session_id and backend.backend_id != remembered:
            # awaited (one Redis write, bounded by timeout_s) so the next turn finds it
            await self.sessions.put(info.session_id, backend.backend_id)
        return backend

    def offer_room(self) -> None:
        """Room may have freed (a finish, a release, a first token): held requests that
        now fit are booked and woken."""
        if len(self.slo.queue):  # on every finish and first token: nothing to do mostly
            placed = self.loop.offer_room(self.clock(), self.rng, self.decisions.keeps)
            self.slo.wake(placed)

    @attempt
    async def _attempt(self, exchange: Exchange, backend: Backend, leg: Leg) -> Relayed:
        """One attempt (a retry counts against the budget while it runs). Raises
        UpstreamFailed only while nothing of it has reached the client."""
        life = exchange.life
        expected = self.watch.started(life, backend)
        exchange.dispatched = self.clock()
        life.attempts.start(self.budget)
        upstream = None
        try:
            upstream, first = await self.first_bytes(exchange, backend, expected)
            if leg.broken is None:
                return await self._relay(exchange, backend, upstream, first)
            if not self.continuer.took(upstream, life.info.prompt_tokens):
                upstream.close()  # its engine refused it (a context too long, say): healthy
                status, upstream = upstream.status, None
                self.watch.forget(life)
                self.settle(life, backend, ok=True)
                raise Refused(f"status {status}")
            return await self._relay_continued(exchange, upstream, first, leg)
        except UpstreamFailed as failure:
            self.failed_attempt(exchange, backend, failure.kind)
            raise
        except asyncio.CancelledError:
            if leg.broken is None:  # (once, however deep the continuations went)
                self._client_gone()
            raise
        finally:
            life.attempts.end(self.budget)
            if upstream is not None:
                upstream.finish()

    def failed_attempt(self, exchange: Exchange, backend: Backend, kind: FailureKind) -> None:
        life = exchange.life
        self.metrics.upstream_failures.labels(backend.backend_id, kind.value).inc()
        self.decisions.failure(life.info, backend, kind.value, emit=life.sampled)
        if kind is FailureKind.STATUS_5XX:
            self.watch.forget(life)
            self._release(life)
            exchange.suspects.append(backend)
        elif kind is FailureKind.RESCUED:
            # Moving work off a slow backend is not an error verdict (counting it as one
            # opened breakers on merely busy backends and cascaded); its duration so far
            # still informs slowness.
            self.watch.gave_up(life)
            self._release(life)
        else:
            self.settle(life, backend, ok=False, fatal=kind.fatal)

    def _client_gone(self, counted: bool = False) -> None:
        """The client left (or was cut off, `counted` elsewhere). Its booking is released
        with no verdict on the backend when its lifetime closes (`Front.close`)."""
        if not counted:
            self.metrics.client_disconnects.inc()

    async def _remembered(self, info: RequestInfo) -> str | None:
        """The backend a replica sent this session to before, unless it is full (whether it
        is still routable, the scheduler checks: an ejected or draining one is no candidate)."""
        if self.sessions is None or not info.session_id:
            return None
        backend_id = await self.sessions.get(info.session_id)
        if backend_id is None or backend_id not in self.scheduler.backends:
            return None
        return backend_id if self.has_room(backend_id) else None

    async def first_bytes(
        self, exchange: Exchange, backend: Backend, expected: float
    ) -> tuple[UpstreamResponse, bytes]:
        """Send the request and wait for the first body bytes, which may be the whole answer
        of a non-streamed request. Until they come the attempt can be moved elsewhere: by a
        failure, or by a rescue (BackendWatch.rescue) when its backend turned bad meanwhile."""
        assert self.session is not None
        life = exchange.life
        base, target = self.urls[backend.backend_id], exchange.target
        self.watch.waiting(life)
        upstream = None
        try:
            try:
                upstream = await self.session.request(
                    "POST", base, target, exchange.body_for(life.model), exchange.headers
                )
                if upstream.status >= 500:
                    raise UpstreamFailed(FailureKind.STATUS_5XX, f"status {upstream.status}")
                first = await upstream.content.readany()
            except UPSTREAM_ERRORS as exc:
                kind = failure_kind(exc)
                raise UpstreamFailed(kind, f"before first byte: {exc!r}") from None
            except asyncio.CancelledError:
                if not self.watch.take_rescue(life):
                    raise
                asyncio.current_task().uncancel()
                message = f"moved off {backend.backend_id}"
                raise UpstreamFailed(FailureKind.RESCUED, message) from None
            if not first and upstream.status < 400:
                raise UpstreamFailed(FailureKind.EMPTY, "closed before the first byte")
            return upstream, first
        except BaseException:
            if upstream is not None:
                upstream.close()
            raise
        finally:
            self.watch.done_waiting(life)

    async def _relay(
        self,
        exchange: Exchange,
        backend: Backend,
        upstream: UpstreamResponse,
        first: bytes,
    ) -> Relayed:
        """The first answer relayed, a stream that broke continued, and the request
        settled."""
        life = exchange.life
        shown = backend.backend_id if self.expose_backend else None
        headers = answer_headers(upstream.headers.items(), life.model, shown)
        response = exchange.response = RelayedResponse(status=upstream.status, headers=headers)
        streamed = is_event_stream(upstream)
        tally = exchange.new_tally(streamed)  # a stream's text is timed (BackendWatch)
        if streamed:
            self.requests.time_text(exchange, tally)
            self.continuer.record(exchange, tally)
        relayed = await relay_body(
            exchange.request,
            response,
            upstream,
            first=first,
            on_first_write=lambda: self._first_written(exchange, tally, streamed, FIRST),
            broken_message=lambda exc: BROKEN_MESSAGE,
            tally=tally,
            write_timeout_s=self.write_timeout_s,
            error_event=stream_error_event(exchange.route),
            end_broken=not streamed,  # a stream may go on elsewhere (`_carry_on`)
        )
        exchange.answer = Answer(upstream.status, relayed.streamed, tally, backend.backend_id)
        if relayed.end is RelayEnd.UPSTREAM_BROKE:  # judged, continued or ended there
            backend, relayed = await self._carry_on(exchange, backend, relayed)
            exchange.answer = Answer(upstream.status, relayed.streamed, tally, backend.backend_id)
        self.requests.relayed(exchange, backend.backend_id, relayed.end is RelayEnd.COMPLETE)
        self._ended(exchange, backend, relayed)
        return relayed

    def _first_written(
        self, exchange: Exchange, tally: ResponseTally, streamed: bool, leg: Leg
    ) -> None:
        """An attempt's first bytes reached the client: the first answer's are its TTFT; a
        continuation's resume it. Either way its engine's prefill is done: room for held
        requests."""
        life = exchange.life
        now = self.clock()
        if leg.broken is None:
            exchange.first_at = now
            self.requests.first_byte(exchange, tally, streamed)
        else:
            self.continuer.resumed(exchange, now, leg.broken)
        life.move(Event.FIRST_BYTE)
        if leg.broken is None:
            first_byte()
        self.scheduler.first_token(life, now, now - exchange.dispatched)
        self.offer_room()
        if streamed:
            self.watch.streaming(life, tally)

    async def _carry_on(
        self, exchange: Exchange, backend: Backend, relayed: Relayed
    ) -> tuple[Backend, Relayed]:
        """A stream broken after its first bytes: the continuer's verdict applied until a
        continuation ends it some other way, or none can go on (then the explicit error
        ends it). Each continuation is one more run of the attempt runner. The backend
        whose stream ended it, and how."""
        continuer, tries = self.continuer, 0
        while relayed.end is RelayEnd.UPSTREAM_BROKE:
            verdict = continuer.verdict(exchange, relayed, tries)
            if verdict is None:  # a whole answer cut short: relay_body closed it
                self._broke(exchange, backend, relayed.error)
                break
            if verdict.action == FINISH:
                return backend, await continuer.finish(
                    exchange, relayed, verdict, self.write_timeout_s
                )
            self._broke(exchange, backend, relayed.error)
            if verdict.action == END:
                await continuer.give_up(exchange, relayed, verdict.reason, self.write_timeout_s)
                break
            assert verdict.broken is not None
            tries += 1
            leg, tokens = continuer.leg(exchange, verdict.broken, tries)
            self.loop.continued(exchange.life, tokens)  # what its prompt lacks yet
            try:
                ran = await self.run(exchange, leg)
            except Refused:
                await continuer.give_up(exchange, relayed, "refused", self.write_timeout_s)
                break
            if ran is None:
                await continuer.give_up(exchange, relayed, NOWHERE, self.write_timeout_s)
                break
            backend, relayed = ran
            continuer.went_on()
        return backend, relayed

    async def _relay_continued(
        self, exchange: Exchange, upstream: UpstreamResponse, first: bytes, leg: Leg
    ) -> Relayed:
        """A continuation's stream spliced into the client's (its tally goes on)."""
        assert exchange.answer is not None and exchange.response is not None
        tally = exchange.answer.tally
        return await relay_spliced(
            exchange.request, exchange.response, upstream, tally,
            self.continuer.splice(exchange, leg), first,
            lambda: self._first_written(exchange, tally, True, leg), BROKEN_MESSAGE,
            self.write_timeout_s,
        )  # fmt: skip

    def _broke(self, exchange: Exchange, backend: Backend, error: BaseException | None) -> None:
        """The body broke after the client saw its first bytes: the backend's verdict."""
        life = exchange.life
        self.metrics.stream_errors.labels(backend.backend_id).inc()
        self.decisions.failure(life.info, backend, FailureKind.STREAM.value, emit=life.sampled)
        # a connection that died mid-stream means the engine died; a timeout may not
        fatal = not isinstance(error, asyncio.TimeoutError)
        self.settle(life, backend, ok=False, fatal=fatal)
        continuation_log.warning(
            "stream from %s broke after first byte: %r", backend.backend_id, error
        )

    def _ended(self, exchange: Exchange, backend: Backend, relayed: Relayed) -> None:
        """How its answer ended: cut off, left, broken for good, or whole (then judged)."""
        life = exchange.life
        if relayed.end is RelayEnd.CLIENT_TOO_SLOW:
            self.metrics.client_write_timeouts.inc()
            log.info("request %s: client behind, cut off", life.request_id)
        if relayed.end in (RelayEnd.CLIENT_GONE, RelayEnd.CLIENT_TOO_SLOW):
            exchange.ending = Event.CANCEL
            self._client_gone(counted=relayed.end is RelayEnd.CLIENT_TOO_SLOW)
            return
        if relayed.end is RelayEnd.UPSTREAM_BROKE:
            exchange.ending = Event.FAIL
            return
        exchange.ending = Event.FINISH
        self._judge_suspects(exchange)
        output = exchange.answer.output_tokens() if exchange.answer else 0
        decode_from, own = exchange.engine_share(output)  # a continuation: its share alone
        ratio = self.watch.succeeded(life, own, decode_from if relayed.streamed else None)
        judged = self.slo.judge(exchange, self.clock(), output)  # as the client saw it
        # 4xx is the client's problem, not the backend's: counted healthy.
        slo = None if exchange.resumed else judged  # the client's view, not the engine's
        self.settle(life, backend, ok=True, output_tokens=own, latency_ratio=ratio, slo=slo)

    def _judge_suspects(self, exchange: Exchange) -> None:
        """Another backend answered: the 5xx answers before were theirs after all."""
        now = self.clock()
        for suspect in exchange.suspects:
            self.record_health(self.scheduler.judge(suspect, ok=False, now=now))
        exchange.suspects.clear()

    # -- bookkeeping -----------------------------------------------------------------------
    def settle(
        self,
        life: RequestLifetime,
        backend: Backend,
        *,
        ok: bool,
        output_tokens: int = 0,
        latency_ratio: float | None = None,
        fatal: bool = False,
        slo: tuple[float | None, bool] | None = None,  # (TPOT, met), when judged
    ) -> None:
        if not ok:
            self.watch.forget(life)
        tpot, met = slo if slo is not None else (None, None)
        outcome = Outcome(
            ok,
            output_tokens,
            life.info.prompt_tokens,
            latency_ratio=latency_ratio,
            tpot_s=tpot,
            met_slo=met,
            fatal=fatal,
        )
        events = self.scheduler.finish(life, outcome, self.clock())
        if events is not None:
            self.offer_room()
            self.record_health(events)

    def _release(self, life: RequestLifetime) -> None:
        """Its booking dropped with no verdict; what it freed goes to held requests."""
        if self.scheduler.release(life):
            self.offer_room()

    def record_health(self, events: HealthEvents) -> None:
        report_health(self.metrics, events)
