"""The router's spans, under the request span gpuroute/tracing.py opens: admission (let in,
or refused and why), each pick (the chosen backend and the decision's terms, from the
decision log's event), each attempt (backend, status, failure kind; its first token an
event, the end of its stream with the tokens relayed), and each continuation of a stream
whose engine broke (the tokens it had, where it went on, how that ended). Each attempt's
engine gets its own `x-request-id` and, where spans record, a traceparent whose parent is
the attempt's span (a continuation's engine: the continuation's).

Tracing off (no tracer in the request's context), each wrapper costs a ContextVar read."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from gpuroute.router.attempts.failure import UpstreamFailed
from opentelemetry import trace

from gpuroute.openai_api import Rejection
from gpuroute.tracing import REQUEST_ID_HEADER, TRACER, W3C, engine_request_id

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
SCALARS = (str, bool, int, float)


def current_span() -> trace.Span | None:
    """The span recording here, or None (tracing off, or this trace not sampled)."""
    if TRACER.get() is None:
        return None
    span = trace.get_current_span()
    return span if span.is_recording() else None


def annotate(event: Mapping[str, Any]) -> None:
    """A decision-log event on the current span (the pick's, the attempt's, admission's):
    its scalar terms as attributes `gpuroute.<term>`, the rest (candidates, exclusions) as
    one event's JSON-free string attributes."""
    span = current_span()
    if span is None:
        return
    kind = str(event.get("event", "decision"))
    flat = {f"gpuroute.{k}": v for k, v in event.items() if isinstance(v, SCALARS)}
    flat.pop("gpuroute.ts", None)
    span.set_attributes(flat)
    rest = {f"gpuroute.{k}": str(v) for k, v in event.items() if not isinstance(v, SCALARS)}
    rest = {k: v for k, v in rest.items() if v != "None"}
    span.add_event(kind, {**{k: v for k, v in flat.items() if k != "gpuroute.policy"}, **rest})


def first_byte() -> None:
    """The first bytes of an answer reached the client."""
    if (span := current_span()) is not None:
        span.add_event("first_byte")


def first_token() -> None:
    """The first generated text reached the client (a whole answer: its first bytes)."""
    if (span := current_span()) is not None:
        span.add_event("first_token")


def admission(fn: F) -> F:
    """Front.admit in its span: the tenant, model and charge admitted, or the refusal."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, route: str, arrival: float) -> Awaitable[Any]:
        tracer = TRACER.get()
        if tracer is None:  # the call's own coroutine: no frame of ours to pass through
            return fn(self, request, route, arrival)
        return spanned(tracer, self, request, route, arrival)

    async def spanned(tracer: Any, self: Any, request: Any, route: str, arrival: float) -> Any:
        with tracer.start_as_current_span("gpuroute.admission", record_exception=False) as span:
            try:
                admitted = await fn(self, request, route, arrival)
            except Rejection as rejection:
                span.set_attributes(
                    {"gpuroute.admitted": False, "gpuroute.status": rejection.status,
                     "gpuroute.code": rejection.code or ""}
                )  # fmt: skip
                raise
            info = admitted.parsed.info
            span.set_attributes(
                {"gpuroute.admitted": True, "gpuroute.tenant": admitted.key.tenant,
                 "gpuroute.model": info.model, "gpuroute.priority": str(info.priority),
                 "gpuroute.charged_tokens": admitted.charged_tokens}
            )  # fmt: skip
            return admitted

    return wrapper  # type: ignore[return-value]


def pick(fn: F) -> F:
    """Forwarder._pick in its span: the decision's terms (annotate), the backend chosen."""

    @functools.wraps(fn)
    def wrapper(self: Any, life: Any, remembered: str | None) -> Awaitable[Any]:
        tracer = TRACER.get()
        if tracer is None:  # (as admission's)
            return fn(self, life, remembered)
        return spanned(tracer, self, life, remembered)

    async def spanned(tracer: Any, self: Any, life: Any, remembered: str | None) -> Any:
        with tracer.start_as_current_span("gpuroute.pick") as span:
            span.set_attribute("gpuroute.attempt", life.attempts.count)
            backend = await fn(self, life, remembered)
            span.set_attribute("gpuroute.chosen", "" if backend is None else backend.backend_id)
            return backend

    return wrapper  # type: ignore[return-value]


def attempt(fn: F) -> F:
    """Forwarder._attempt with this attempt's engine headers; the first answer's attempt
    in its span (CLIENT), a continuation's under its continuation's span (`continuation`).
    Untraced, the call's own coroutine is handed back (no frame resumed on every chunk)."""

    @functools.wraps(fn)
    def wrapper(self: Any, exchange: Any, backend: Any, leg: Any) -> Awaitable[Any]:
        life = exchange.life
        count = life.attempts.count + leg.tries  # a continuation's engine: an id of its own
        exchange.headers[REQUEST_ID_HEADER] = engine_request_id(life.request_id, count)
        tracer = TRACER.get()
        if tracer is None or leg.broken is not None:
            return fn(self, exchange, backend, leg)
        return spanned(tracer, self, exchange, backend, leg, count)

    async def spanned(
        tracer: Any, self: Any, exchange: Any, backend: Any, leg: Any, count: int
    ) -> Any:
        attributes = {
            "gpuroute.backend": backend.backend_id,
            "gpuroute.attempt": count,
            "gpuroute.engine_request_id": exchange.headers[REQUEST_ID_HEADER],
        }
        with tracer.start_as_current_span(
            "gpuroute.attempt", kind=trace.SpanKind.CLIENT, attributes=attributes,
            record_exception=False,
        ) as span:  # fmt: skip
            exchange.headers.pop("tracestate", None)
            W3C.inject(exchange.headers)  # the engine's parent: this span
            try:
                relayed = await fn(self, exchange, backend, leg)
            except UpstreamFailed as failure:
                span.set_attribute("gpuroute.failure_kind", failure.kind.value)
                span.set_status(trace.StatusCode.ERROR, str(failure))
                raise
            ended(span, exchange, exchange.response.status)
            return relayed

    return wrapper  # type: ignore[return-value]


def continuation(fn: F) -> F:
    """Forwarder.run for a continuation of a broken stream, in its span (CLIENT): the
    parent of its engine's trace (the first answer's run: no span of its own)."""

    @functools.wraps(fn)
    def wrapper(self: Any, exchange: Any, leg: Any, *args: Any) -> Awaitable[Any]:
        tracer = TRACER.get()
        if tracer is None or leg.broken is None:  # the call's own coroutine (as attempt's)
            return fn(self, exchange, leg, *args)
        return spanned(tracer, self, exchange, leg, *args)

    async def spanned(tracer: Any, self: Any, exchange: Any, leg: Any, *args: Any) -> Any:
        broken = leg.broken
        attributes = {"gpuroute.continuation": leg.tries, "gpuroute.tokens_before": broken.tokens,
                      "gpuroute.token_exact": broken.token_ids is not None}  # fmt: skip
        with tracer.start_as_current_span(
            "gpuroute.continuation", kind=trace.SpanKind.CLIENT, attributes=attributes,
            record_exception=False,
        ) as span:  # fmt: skip
            exchange.headers.pop("tracestate", None)
            W3C.inject(exchange.headers)
            try:
                ran = await fn(self, exchange, leg, *args)
            except Exception as exc:  # refused by its engine: the runner ends the stream
                span.set_status(trace.StatusCode.ERROR, repr(exc))
                raise
            if ran is None:
                span.set_attribute("gpuroute.outcome", "no_backend")
                return None
            backend, relayed = ran
            span.set_attributes({"gpuroute.backend": backend.backend_id,
                                 "gpuroute.outcome": relayed.end.value})  # fmt: skip
            return ran

    return wrapper  # type: ignore[return-value]


def ended(span: trace.Span, exchange: Any, status: int) -> None:
    """The attempt's answer: its status and how the stream ended, with its tokens."""
    span.set_attribute("http.response.status_code", status)
    answer = exchange.answer
    tokens = 0 if answer is None else answer.output_tokens()
    ending = str(exchange.ending)
    span.add_event("stream_end", {"gpuroute.output_tokens": tokens, "gpuroute.ending": ending})
    span.set_attribute("gpuroute.output_tokens", tokens)
    if status >= 500:
        span.set_status(trace.StatusCode.ERROR)
