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
    async def wrapper(self: Any, request: Any, route: str, arrival: float) -> Any:
        tracer = TRACER.get()
        if tracer is None:
            return await fn(self, request, route, arrival)
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
    async def wrapper(self: Any, life: Any, remembered: str | None) -> Any:
        tracer = TRACER.get()
        if tracer is None:
            return await fn(self, life, remembered)
        with tracer.start_as_current_span("gpuroute.pick") as span:
            span.set_attribute("gpuroute.attempt", life.attempts.count)
            backend = await fn(self, life, remembered)
            span.set_attribute("gpuroute.chosen", "" if backend is None else backend.backend_id)
            return backend

    return wrapper  # type: ignore[return-value]


def attempt(fn: F) -> F:
    """Forwarder._attempt with this attempt's engine headers, in its span (CLIENT)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, exchange: Any, backend: Any, attempts: Any) -> Any:
        life = exchange.life
        exchange.headers[REQUEST_ID_HEADER] = engine_request_id(life.request_id, attempts.count)
        tracer = TRACER.get()
        if tracer is None:
            return await fn(self, exchange, backend, attempts)
        attributes = {
            "gpuroute.backend": backend.backend_id,
            "gpuroute.attempt": attempts.count,
            "gpuroute.engine_request_id": exchange.headers[REQUEST_ID_HEADER],
        }
        with tracer.start_as_current_span(
            "gpuroute.attempt", kind=trace.SpanKind.CLIENT, attributes=attributes,
            record_exception=False,
        ) as span:  # fmt: skip
            exchange.headers.pop("tracestate", None)
            W3C.inject(exchange.headers)  # the engine's parent: this span
            try:
                response = await fn(self, exchange, backend, attempts)
            except UpstreamFailed as failure:
                span.set_attribute("gpuroute.failure_kind", failure.kind.value)
                span.set_status(trace.StatusCode.ERROR, str(failure))
                raise
            ended(span, exchange, response.status)
            return response

    return wrapper  # type: ignore[return-value]


def continuation(fn: F) -> F:
    """BackendStream.attempt in its span (CLIENT): one continuation of a broken stream, the
    parent of its engine's trace."""

    @functools.wraps(fn)
    async def wrapper(self: Any, tally: Any, broken: Any, tries: int) -> Any:
        tracer = TRACER.get()
        if tracer is None:
            return await fn(self, tally, broken, tries)
        attributes = {"gpuroute.continuation": tries, "gpuroute.tokens_before": broken.tokens,
                      "gpuroute.token_exact": broken.token_ids is not None}  # fmt: skip
        with tracer.start_as_current_span(
            "gpuroute.continuation", kind=trace.SpanKind.CLIENT, attributes=attributes,
            record_exception=False,
        ) as span:  # fmt: skip
            self.exchange.headers.pop("tracestate", None)
            W3C.inject(self.exchange.headers)
            try:
                relayed = await fn(self, tally, broken, tries)
            except Exception as exc:  # refused by its engine: the loop ends the stream
                span.set_status(trace.StatusCode.ERROR, repr(exc))
                raise
            if relayed is None:
                span.set_attribute("gpuroute.outcome", "no_backend")
                return None
            span.set_attributes({"gpuroute.backend": self.backend.backend_id,
                                 "gpuroute.outcome": relayed.end.value})  # fmt: skip
            return relayed

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
