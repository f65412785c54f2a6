"""The data plane: admit, pick a backend, forward, relay the stream, settle the books.

Every request ends in exactly one of: a relayed response, an OpenAI-format error, or an
explicit SSE error event after a stream broke; its ledger entry is released on every path."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import random
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from gpuroute.router.admission_gate import AdmissionGate, Refused
from gpuroute.router.config import RouterConfig
from gpuroute.router.core.backend import Backend, BackendState
from gpuroute.router.core.health import HealthEvents
from gpuroute.router.core.policies.prefix_affinity import PrefixAffinity
from gpuroute.router.core.scheduler import Outcome, Scheduler
from gpuroute.router.decision_log import DecisionLog
from gpuroute.router.metrics import RouterMetrics
from gpuroute.router.priors import GpuPriors
from gpuroute.router.quotas import Quotas
from gpuroute.router.request_parse import ParsedRequest, RequestError, parse_request
from gpuroute.router.sessions import SessionStore
from gpuroute.router.tenant_gate import Refusal, TenantGate
from gpuroute.router.watch import BackendWatch

from gpuroute.openai_api import error_response
from gpuroute.relay import (
    REQUEST_DROP,
    RESPONSE_DROP,
    UPSTREAM_ERRORS,
    RelayEnd,
    forward_headers,
    relay_body,
)

log = logging.getLogger("gpuroute.router")
BACKEND_HEADER = "x-gpuroute-backend"


class UpstreamFailed(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Proxy:
    def __init__(
        self,
        config: RouterConfig,
        scheduler: Scheduler,
        metrics: RouterMetrics,
        priors: dict[str, GpuPriors],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.metrics = metrics
        self.priors = priors
        self.clock = clock
        self.rng = rng or random.Random()
        self.urls = {b.backend_id: b.url for b in config.backends}
        limits = {b.backend_id: b.max_inflight for b in config.backends}
        # hashing every prompt's blocks is wasted work unless the policy looks at them
        self.reads_prefix_blocks = config.policy == PrefixAffinity.name
        self.watch = BackendWatch(scheduler, priors, clock, config.retry.rescue_slowness)
        self.decisions = DecisionLog(config.decision_log_sample, config.policy)
        self.gate = AdmissionGate(config.admission, scheduler.backends, limits, metrics, clock)
        self.session: aiohttp.ClientSession | None = None
        self.quotas = Quotas.from_config(
            config.auth,
            config.redis,
            clock,
            lambda shared: metrics.quota_shared.set(shared),
            config.region,
        )
        metrics.quota_shared.set(float(self.quotas.shared))
        self.tenants = TenantGate(self.quotas, metrics)
        self.sessions = SessionStore.from_config(config.redis, clock)
        self._ids = itertools.count(1)
        self.active = 0
        self.active_retries = 0
        # the last completions, for the region report's recent p99s
        self.recent_ttft: collections.deque[float] = collections.deque(maxlen=2000)
        self.recent_e2e: collections.deque[float] = collections.deque(maxlen=2000)
        self.idle = asyncio.Event()
        self.idle.set()
        limits_cfg = config.limits
        self.timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=limits_cfg.connect_timeout_s,
            sock_read=limits_cfg.first_byte_timeout_s,
        )

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=self.timeout
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.quotas.close()
        if self.sessions is not None:
            await self.sessions.close()

    # -- entry points ----------------------------------------------------------------------
    async def openai(self, request: web.Request) -> web.StreamResponse:
        route = request.path
        arrival = self.clock()
        self.active += 1
        self.idle.clear()
        self.metrics.in_flight.inc()
        status = 500
        try:
            response = await self._openai(request, route, arrival)
        except Exception:  # a bug must still answer in OpenAI's format, never a bare 500
            log.exception("internal error on %s", route)
            response = error_response(500, "internal router error", code="internal_error")
        try:
            status = response.status
            return response
        finally:
            self.active -= 1
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(route, str(status)).inc()
            elapsed = self.clock() - arrival
            self.metrics.duration.labels(route).observe(elapsed)
            if status == 200:
                self.recent_e2e.append(elapsed)
            if self.active == 0:
                self.idle.set()

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        """Other paths go to the least busy ready backend, unscheduled and unretried."""
        ready = [b for b in self.scheduler.backends if b.state is BackendState.READY]
        if not ready:
            return error_response(503, "no backend is ready", code="no_backend")
        backend = min(ready, key=lambda b: b.in_flight)
        assert self.session is not None
        try:
            async with self.session.request(
                request.method,
                self.urls[backend.backend_id] + request.path_qs,
                data=await request.read(),
                headers=forward_headers(request.headers.items(), REQUEST_DROP),
            ) as upstream:
                body = await upstream.read()
                headers = forward_headers(upstream.headers.items(), RESPONSE_DROP)
                return web.Response(status=upstream.status, body=body, headers=headers)
        except UPSTREAM_ERRORS as exc:
            return error_response(
                502, f"backend {backend.backend_id}: {exc!r}", code="upstream_error"
            )

    # -- the request path ------------------------------------------------------------------
    async def _openai(self, request: web.Request, route: str, arrival: float) -> web.StreamResponse:
        config = self.config
        try:
            key = self.tenants.identify(request)
        except Refusal as refusal:
            return refusal.response
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"request body exceeds {config.limits.max_body_bytes} bytes")
        try:
            parsed = parse_request(
                route,
                raw,
                request.headers,
                next(self._ids),
                priorities=tuple(config.admission.priorities),
                default_priority=config.admission.default_priority,
                with_prefix_blocks=self.reads_prefix_blocks,
            )
        except RequestError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        info = parsed.info
        if not self.scheduler.backends.serves(info.model):
            return error_response(
                404,
                f"The model `{info.model}` does not exist.",
                param="model",
                code="model_not_found",
            )
        if not self.scheduler.backends.routable(info.model):
            return error_response(
                503, f"no healthy backend can serve model `{info.model}` now", code="no_backend"
            )
        if key is not None:
            try:
                await self.tenants.charge(key, info, "x-gpuroute-priority" in request.headers)
            except Refusal as refusal:
                return refusal.response
        try:
            await self.gate.admit(info, parsed.deadline_s)
        except Refused as refusal:
            return error_response(
                refusal.status, refusal.message, code=refusal.reason, headers=refusal.headers
            )
        try:
            return await self._attempts(request, parsed, raw, route, arrival)
        finally:
            self.gate.pump()

    async def _attempts(
        self, request: web.Request, parsed: ParsedRequest, raw: bytes, route: str, arrival: float
    ) -> web.StreamResponse:
        info = parsed.info
        retry = self.config.retry
        tried: set[str] = set()
        remembered = await self._remembered(info)
        last = "no backend is available"
        attempt, attempts, rescued = 0, retry.max_attempts, False
        while attempt < attempts:
            if attempt:
                if not rescued and not self._retry_allowed():
                    self.metrics.retry_budget_exhausted.inc()
                    break
                delay = min(retry.backoff_max_s, retry.backoff_base_s * 2 ** (attempt - 1))
                await asyncio.sleep(self.rng.uniform(0, delay))  # jittered backoff, not a sync
            started = time.perf_counter()
            decision = self.scheduler.route(
                info,
                self.clock(),
                self.rng,
                exclude=tried,
                prefer=remembered,
                explain=self.decisions.wants_next(),
            )
            self.metrics.decision.observe(time.perf_counter() - started)
            if decision is None:
                break
            backend = decision.backend
            tried.add(backend.backend_id)
            if self.sessions is not None and info.session_id and backend.backend_id != remembered:
                # awaited (one Redis write, bounded by timeout_s) so the next turn finds it
                await self.sessions.put(info.session_id, backend.backend_id)
            expected = self.watch.started(info, backend)
            self.decisions.decision(info, decision, attempt)
            if attempt:
                self.active_retries += 1
            try:
                return await self._forward(request, parsed, raw, route, backend, arrival, expected)
            except UpstreamFailed as failure:
                last = f"backend {backend.backend_id}: {failure}"
                self.metrics.upstream_failures.labels(backend.backend_id, failure.kind).inc()
                self.decisions.failure(info.request_id, backend, failure.kind)
                # nothing listening, or the connection died under us: the engine is gone
                rescued = failure.kind == "rescued"
                if rescued:
                    # Moving work off a slow backend is not an error verdict (counting it as
                    # one opened breakers on merely busy backends and cascaded); its duration
                    # so far still informs slowness.
                    self.watch.gave_up(info.request_id)
                    self.scheduler.release(info.request_id)
                else:
                    # nothing listening, or the connection died under us: the engine is gone
                    fatal = failure.kind in ("refused", "connection")
                    self._settle(info, backend, ok=False, fatal=fatal)
                if rescued:
                    attempts += 1  # moving off a bad backend is not the request's fault
                if attempt + 1 < attempts:
                    self.metrics.retries.labels(failure.kind).inc()
            finally:
                if attempt:
                    self.active_retries -= 1
            attempt += 1
        if not tried:
            return error_response(
                503, f"no healthy backend can serve model `{info.model}` now", code="no_backend"
            )
        return error_response(502, f"all attempts failed; last: {last}", code="upstream_error")

    async def _remembered(self, info) -> str | None:
        """The backend a replica sent this session to before, unless it is full (whether it
        is still routable, the scheduler checks: an ejected or draining one is no candidate)."""
        if self.sessions is None or not info.session_id:
            return None
        backend_id = await self.sessions.get(info.session_id)
        if backend_id is None or backend_id not in self.scheduler.backends:
            return None
        if self.scheduler.backends.get(backend_id).in_flight >= self.gate.max_inflight.get(
            backend_id, 0
        ):
            return None
        return backend_id

    def _retry_allowed(self) -> bool:
        retry = self.config.retry
        budget = max(retry.min_retries_concurrent, retry.budget_ratio * self.active)
        return self.active_retries < budget

    async def _forward(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        raw: bytes,
        route: str,
        backend: Backend,
        arrival: float,
        expected: float,
    ) -> web.StreamResponse:
        """One attempt. Raises UpstreamFailed only while nothing has reached the client."""
        info = parsed.info
        url = self.urls[backend.backend_id] + request.path_qs
        headers = forward_headers(request.headers.items(), REQUEST_DROP)
        batch_at_start = backend.in_flight - 1  # the ledger already counts this request
        started = self.clock()
        upstream = None
        try:
            upstream, first = await self._first_bytes(info, backend, url, raw, headers, expected)
            return await self._relay(
                request, parsed, route, backend, upstream, first, arrival, started, batch_at_start
            )
        except asyncio.CancelledError:
            self.scheduler.release(info.request_id)  # client went away
            self.watch.forget(info.request_id)
            self.metrics.client_disconnects.inc()
            raise
        finally:
            if upstream is not None:
                if upstream.content.at_eof():
                    upstream.release()  # the connection goes back to the pool
                else:
                    upstream.close()

    async def _first_bytes(
        self, info, backend: Backend, url: str, raw: bytes, headers: dict, expected: float
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        """Send the request and wait for the first body bytes, which may be the whole answer
        of a non-streamed request. Until they come the attempt can be moved elsewhere: by a
        failure, or by `rescue_stuck` when its backend turned bad meanwhile."""
        assert self.session is not None
        rid = info.request_id
        self.watch.waiting(rid, backend, expected)
        upstream = None
        try:
            try:
                upstream = await self.session.post(url, data=raw, headers=headers)
                if upstream.status >= 500:
                    raise UpstreamFailed("5xx", f"status {upstream.status}")
                first = await upstream.content.readany()
            except UPSTREAM_ERRORS as exc:
                raise UpstreamFailed(_kind(exc), f"before first byte: {exc!r}") from None
            except asyncio.CancelledError:
                if not self.watch.take_rescue(rid):
                    raise
                asyncio.current_task().uncancel()
                raise UpstreamFailed("rescued", f"moved off {backend.backend_id}") from None
            if not first and upstream.status < 400:
                raise UpstreamFailed("empty", "closed before the first byte")
            return upstream, first
        except BaseException:
            if upstream is not None:
                upstream.close()
            raise
        finally:
            self.watch.done_waiting(rid, backend)

    async def _relay(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        route: str,
        backend: Backend,
        upstream: aiohttp.ClientResponse,
        first: bytes,
        arrival: float,
        started: float,
        batch_at_start: int,
    ) -> web.StreamResponse:
        info = parsed.info
        headers = forward_headers(upstream.headers.items(), RESPONSE_DROP)
        headers[BACKEND_HEADER] = backend.backend_id
        response = web.StreamResponse(status=upstream.status, headers=headers)

        def first_written() -> None:
            ttft = self.clock() - arrival
            self.metrics.ttft.labels(route).observe(ttft)
            self.recent_ttft.append(ttft)

        relayed = await relay_body(
            request,
            response,
            upstream,
            first=first,
            on_first_write=first_written,
            broken_message=lambda exc: (
                f"upstream {backend.backend_id} failed mid-stream: {type(exc).__name__}"
            ),
        )
        if relayed.end is RelayEnd.CLIENT_GONE:
            return self._client_gone(info, response)
        if relayed.end is RelayEnd.UPSTREAM_BROKE:
            assert relayed.error is not None
            self._broken_stream(info, backend, relayed.error)
            return response
        output = relayed.tally.output_tokens(relayed.streamed)
        ratio = self.watch.succeeded(info, backend, output, started, batch_at_start)
        # 4xx is the client's problem, not the backend's: counted healthy.
        self._settle(info, backend, ok=True, output_tokens=output, latency_ratio=ratio)
        return response

    def _broken_stream(self, info, backend: Backend, exc: BaseException) -> None:
        """The body broke after the client saw its first bytes (relay_body ended it)."""
        self.metrics.stream_errors.labels(backend.backend_id).inc()
        self.decisions.failure(info.request_id, backend, "stream")
        # a connection that died mid-stream means the engine died; a timeout may not
        self._settle(info, backend, ok=False, fatal=not isinstance(exc, asyncio.TimeoutError))
        log.warning("stream from %s broke after first byte: %r", backend.backend_id, exc)

    def _client_gone(self, info, response: web.StreamResponse) -> web.StreamResponse:
        self.metrics.client_disconnects.inc()
        self.scheduler.release(info.request_id)
        self.watch.forget(info.request_id)
        response.force_close()
        return response

    # -- bookkeeping -----------------------------------------------------------------------
    def _settle(
        self,
        info,
        backend: Backend,
        *,
        ok: bool,
        output_tokens: int = 0,
        latency_ratio: float | None = None,
        fatal: bool = False,
    ) -> None:
        if not ok:
            self.watch.forget(info.request_id)
        outcome = Outcome(
            ok, output_tokens, info.prompt_tokens, latency_ratio=latency_ratio, fatal=fatal
        )
        events = self.scheduler.finish(info.request_id, info.model, outcome, self.clock())
        if events is not None:
            self.record_health(events)

    def record_health(self, events: HealthEvents) -> None:
        for backend_id, transition in events.breaker:
            self.metrics.breaker_transitions.labels(backend_id, transition.after.value).inc()
            log.warning(
                "breaker %s: %s -> %s", backend_id, transition.before.value, transition.after.value
            )
        for ejection in events.ejections:
            self.metrics.ejections.labels(ejection.reason, str(ejection.enforced).lower()).inc()
            log.warning(
                "outlier %s: %s (enforced=%s)",
                ejection.backend_id,
                ejection.reason,
                ejection.enforced,
            )


def _kind(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "refused"  # nothing listens: the engine process is gone
        return "connect"
    return "connection"
