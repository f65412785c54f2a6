"""Request ids and W3C trace context at every tier, and OpenTelemetry spans where
`[tracing] otlp_endpoint` turns them on (off by default: no exporter, no span made).

What a client sends is read, never trusted as it came:

- `x-request-id` is never the request's id: each tier gives every request an id of its own
  (random, unique: a client's id is any tenant's to reuse), answered, logged and sent to the
  next hop. A client's id is kept beside it (`client_request_id`, in the access line) when it
  is 1-128 characters of `[A-Za-z0-9._:-]`, else dropped (never echoed or logged raw);
- `traceparent` is kept only as version 00 with a non-zero 32-hex trace id and 16-hex span id;
  anything else is replaced by a new trace (its `tracestate` dropped with it).

Each hop gets the request's id and a traceparent whose parent is this tier's span (the
tier's request span, or at the router the attempt's span: gpuroute/router/tracing_spans.py).
An engine gets `<request id>-<attempt>-<8 hex>`, unique per attempt, never the client's id
alone: some vLLM versions key requests by it, so one tenant's id could collide with
another's."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

from aiohttp import web
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pydantic import Field

from gpuroute.config import HttpUrl, StrictModel
from gpuroute.request_context import REQUEST_ID as LOG_REQUEST_ID

REQUEST_ID_HEADER = "x-request-id"
TRACE_HEADERS = frozenset({"traceparent", "tracestate", REQUEST_ID_HEADER})
SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
TRACESTATE = re.compile(r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]+=[\x20-\x2b\x2d-\x3c\x3e-\x7e]*")
UNTRACED = ("/healthz", "/readyz", "/metrics", "/admin/")
REQUEST_ID = web.RequestKey("gpuroute.request_id", str)  # this tier's own, answered
# the client's own `x-request-id`, when safe to log (kept beside ours: clients' are not unique)
CLIENT_REQUEST_ID = web.RequestKey("gpuroute.client_request_id", str)
ONWARD = web.RequestKey("gpuroute.trace_onward", dict)  # validated trace headers that came
TRACING = web.AppKey("gpuroute.tracing", object)  # the app's Tracing (tests read its spans)
TRACER: ContextVar[trace.Tracer | None] = ContextVar("gpuroute_tracer", default=None)
W3C = TraceContextTextMapPropagator()


class TracingConfig(StrictModel):
    """`[tracing]`: where spans go. No endpoint: no exporter and no spans."""

    otlp_endpoint: HttpUrl | None = None  # the collector's OTLP/HTTP traces URL
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    service_name: str | None = Field(default=None, min_length=1, max_length=100)


def new_request_id() -> str:
    """Unguessable and unique across tiers, workers and replicas (16 hex digits; a counter
    would tell anyone who sees two ids how busy the tier is). The OS's random bytes, as
    `secrets.token_hex` reads them, without its two layers of calls on every request."""
    return os.urandom(8).hex()


def client_request_id(values: list[str]) -> str | None:
    """The client's `x-request-id` (every copy of the header that came) when it sent one
    that is safe to write into a log line, else None."""
    if len(values) == 1 and SAFE_ID.fullmatch(values[0]):
        return values[0]
    return None


def engine_request_id(request_id: str | int, attempt: int) -> str:
    """The id an engine gets for one attempt: unique even when clients reuse theirs."""
    return f"{request_id}-{attempt}-{os.urandom(4).hex()}"


def valid_traceparent(value: str | None) -> str | None:
    """The traceparent if it is a well-formed version-00 one with non-zero ids, else None."""
    if value is None or (match := TRACEPARENT.fullmatch(value)) is None:
        return None
    trace_id, span_id, _flags = match.groups()
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return value


def valid_tracestate(value: str | None) -> str | None:
    """A tracestate of at most 32 well-formed members in 512 characters, else None."""
    if value is None or len(value) > 512:
        return None
    members = [m.strip() for m in value.split(",") if m.strip()]
    if not members or len(members) > 32 or not all(TRACESTATE.fullmatch(m) for m in members):
        return None
    return ",".join(members)


def fresh_traceparent() -> str:
    """A new trace's traceparent (unsampled: nothing of ours records it)."""
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-00"


def incoming(values: Callable[[str], list[str]]) -> tuple[dict[str, str], bool]:
    """The trace headers worth passing on, and whether they are the caller's: a valid
    traceparent (with its valid tracestate); a new trace in place of a malformed one (or of
    two); none when it sent none. `values(name)`: every copy of a header that came."""
    parents = values("traceparent")
    if not parents:
        return {}, False
    parent = valid_traceparent(parents[0]) if len(parents) == 1 else None
    if parent is None:
        return {"traceparent": fresh_traceparent()}, False
    out = {"traceparent": parent}
    states = values("tracestate")
    if len(states) == 1 and (state := valid_tracestate(states[0])) is not None:
        out["tracestate"] = state
    return out, True


def onward(request: web.Request, attempt: int | None = None) -> dict[str, str]:
    """Trace headers for the next hop: the current span as parent (where a span records
    here) or the valid context that came (passed on as it was), and this request's id (for
    an engine, `attempt`'s own id: `engine_request_id`)."""
    out = dict(request.get(ONWARD) or {})
    if TRACER.get() is not None:
        out.pop("tracestate", None)
        W3C.inject(out)  # the current span; nothing when none is current
    rid = request.get(REQUEST_ID) or new_request_id()
    out[REQUEST_ID_HEADER] = rid if attempt is None else engine_request_id(rid, attempt)
    return out


EXPORT_BATCH_SPANS = 64


class Tracing:
    """One tier's tracer: an SDK provider exporting over OTLP/HTTP, made in the serving
    process at startup and flushed at cleanup; None while tracing is off."""

    def __init__(self, config: TracingConfig, service: str, region: str | None = None) -> None:
        """`region`: the cloud region this process serves (every span's resource carries
        it as `cloud.region`, OpenTelemetry's name), None where there is none."""
        self.config, self.service = config, config.service_name or service
        self.region = region
        self.provider: object | None = None
        self.tracer: trace.Tracer | None = None

    def start(self, exporter: object | None = None) -> None:
        """The provider and its batch exporter (`exporter`: a test's, else OTLP/HTTP)."""
        if self.tracer is not None or (self.config.otlp_endpoint is None and exporter is None):
            return  # started already (a test's exporter), or off
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        # a client's sampled flag is not trusted (it could have every request traced): the
        # ratio is applied to the trace id, so every tier with the same ratio keeps a trace
        ratio = TraceIdRatioBased(self.config.sample_ratio)
        sampler = ParentBased(ratio, remote_parent_sampled=ratio, remote_parent_not_sampled=ratio)
        facts = {"service.name": self.service}
        if self.region:
            facts["cloud.region"] = self.region
        provider = TracerProvider(sampler=sampler, resource=Resource.create(facts))
        exporter = exporter or OTLPSpanExporter(endpoint=self.config.otlp_endpoint)
        # small batches: the exporter's thread encodes a batch holding the GIL (~40 µs a
        # span), so the SDK's 512 would stall every request for ~20 ms at each export
        batches = BatchSpanProcessor(exporter, max_export_batch_size=EXPORT_BATCH_SPANS)  # type: ignore[arg-type]
        provider.add_span_processor(batches)
        self.provider, self.tracer = provider, provider.get_tracer("gpuroute")

    def stop(self) -> None:
        """Flush what is batched and stop exporting."""
        if self.provider is not None:
            self.provider.shutdown()  # type: ignore[attr-defined]
            self.provider = self.tracer = None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middleware(tracing: Tracing) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Every request's own id given (on every route: the client's kept beside it) and its
    trace context validated; a request span (SERVER, child of the client's context) around
    the handler where tracing is on."""

    @web.middleware
    async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
        # None when none usable came: set either way (a missed key costs an exception
        # on every later `request.get`)
        request[CLIENT_REQUEST_ID] = client_request_id(
            request.headers.getall(REQUEST_ID_HEADER, [])
        )
        rid = request[REQUEST_ID] = new_request_id()
        came, adopted = incoming(lambda name: request.headers.getall(name, []))
        request[ONWARD] = came
        tracer = tracing.tracer
        log_token = LOG_REQUEST_ID.set(rid)
        try:
            if tracer is None or request.path.startswith(UNTRACED):
                return await handler(request)
            parent = W3C.extract(dict(came)) if adopted else Context()  # else: a new trace
            return await _spanned(tracer, request, handler, parent, rid)
        finally:
            LOG_REQUEST_ID.reset(log_token)

    return traced


async def _spanned(
    tracer: trace.Tracer,
    request: web.Request,
    handler: Handler,
    parent: Context,
    rid: str,
) -> web.StreamResponse:
    route = request.match_info.route.resource
    path = route.canonical if route is not None else "unmatched"
    attributes = {"http.request.method": request.method, "url.path": path}
    attributes["gpuroute.request_id"] = rid
    token = TRACER.set(tracer)
    try:
        with tracer.start_as_current_span(
            f"{request.method} {path}", context=parent, kind=trace.SpanKind.SERVER,
            attributes=attributes,
        ) as span:  # fmt: skip
            if not span.is_recording():  # a trace not sampled: no spans below this one,
                unsampled: dict[str, str] = {}  # and the next hops told so (flags 00)
                W3C.inject(unsampled)
                request[ONWARD] = unsampled
                TRACER.set(None)  # (the finally's reset restores it)
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(trace.StatusCode.ERROR)
            return response
    finally:
        TRACER.reset(token)


async def name_request(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer names its request (`x-request-id`); an upstream's own id is replaced."""
    if (rid := request.get(REQUEST_ID)) is not None:
        response.headers[REQUEST_ID_HEADER] = rid


def install(
    app: web.Application, config: TracingConfig, service: str, region: str | None = None
) -> Tracing:
    """Request ids, trace-context validation and (where configured) spans for `app`."""
    tracing = app[TRACING] = Tracing(config, service, region)
    app.middlewares.insert(0, middleware(tracing))
    app.on_response_prepare.append(name_request)

    async def started(_app: web.Application) -> None:
        tracing.start()

    async def stopped(_app: web.Application) -> None:
        tracing.stop()

    app.on_startup.append(started)
    app.on_cleanup.append(stopped)
    return tracing
