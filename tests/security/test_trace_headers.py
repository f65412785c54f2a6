"""A client's `x-request-id` and W3C trace context are read, never trusted as they came
(issue 34, "Bad input"). Before, the router passed a client's `traceparent` and
`tracestate` to engines byte for byte, whatever they held (a forged or oversized context
reached every engine's tracing), and a request id a client sent would have been echoed into
answers and logs. Now a malformed one is replaced: an id by 16 fresh hex digits, a context by
a new trace, and nothing of the original goes on or comes back."""

from __future__ import annotations

import re

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.live import router_server, scripted_backend, spans_to
from support_security import RecordingEngine, chat, secure_toml, send_raw

pytestmark = pytest.mark.asyncio
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
GOOD = f"00-{TRACE}-00f067aa0ba902b7-01"
FRESH_ID = re.compile(r"[0-9a-f]{16}")
BAD_IDS = [
    "a" * 129,  # too long
    "two words",
    "semi;colon",
    "<script>alert(1)</script>",
    "%0d%0aSet-Cookie:%20pwned=1",  # an encoded CRLF, injected into a log or a header
    "ïd-unicode",
    "tab\there",
    "",
]
BAD_PARENTS = [
    f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
    f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
    f"ff-{TRACE}-00f067aa0ba902b7-01",  # the forbidden version
    f"01-{TRACE}-00f067aa0ba902b7-01-extra",  # a version we do not read
    f"00-{TRACE.upper()}-00F067AA0BA902B7-01",  # uppercase hex
    f"00-{TRACE}-00f067aa0ba902b7-01-trailing",
    f"00-{TRACE[:-1]}-00f067aa0ba902b7-01",  # short
    f"00-{TRACE}-00f067aa0ba902b7-0g",  # not hex
    f"00-{TRACE}-00f067aa0ba902b7-01" + "0" * 8000,  # oversized
    "garbage",
]


async def _one(tmp_path, headers: list[tuple[str, str]], top: str = ""):
    """One chat request through a router (tracing as `top` says) to a recording engine:
    (the answer, the engine's headers by lowercase name, the router's app)."""
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        async with router_server(secure_toml(url, top=top), tmp_path) as server:
            answer = await send_raw(f"http://127.0.0.1:{server.port}", headers, chat())
    seen = {k.lower(): v for k, v in engine.seen[0][1].items()} if engine.seen else {}
    return answer, seen


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_a_malformed_request_id_is_replaced_never_echoed(tmp_path, bad: str) -> None:
    answer, seen = await _one(tmp_path, [("X-Request-Id", bad)])
    assert answer.status == 200, answer.body
    rid = answer.headers["x-request-id"]
    assert FRESH_ID.fullmatch(rid) and rid != bad
    assert re.fullmatch(rf"{rid}-0-[0-9a-f]{{8}}", seen["x-request-id"])
    if bad:
        assert all(bad not in v for v in seen.values())
        assert all(bad not in v for v in answer.headers.values())
    assert "set-cookie" not in answer.headers


async def test_two_request_ids_are_replaced(tmp_path) -> None:
    answer, seen = await _one(tmp_path, [("X-Request-Id", "one"), ("x-request-id", "two")])
    rid = answer.headers["x-request-id"]
    assert FRESH_ID.fullmatch(rid)
    assert "one" not in seen["x-request-id"] and "two" not in seen["x-request-id"]


async def test_a_valid_request_id_is_kept_and_the_engine_gets_its_own(tmp_path) -> None:
    """A client's id is any tenant's to reuse (issue 42 finding 10): the router answers its
    own id and keeps the client's beside it (`client_request_id`: tests/security/
    test_request_ids.py); the engine gets neither alone (some vLLM versions key requests
    by it)."""
    answer, seen = await _one(tmp_path, [("X-Request-Id", "client-42:a.b_c")])
    rid = answer.headers["x-request-id"]
    assert FRESH_ID.fullmatch(rid)
    assert re.fullmatch(rf"{rid}-0-[0-9a-f]{{8}}", seen["x-request-id"])
    assert "client-42" not in seen["x-request-id"]


@pytest.mark.parametrize("bad", BAD_PARENTS)
async def test_a_malformed_traceparent_is_replaced_with_a_new_trace(tmp_path, bad: str) -> None:
    headers = [("traceparent", bad), ("tracestate", "vendor=forged")]
    answer, seen = await _one(tmp_path, headers)
    assert answer.status == 200, answer.body
    parent = seen["traceparent"]
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]", parent), parent
    assert TRACE not in parent.lower() and parent != bad
    assert "tracestate" not in seen  # it belonged to the context that was dropped


async def test_two_traceparents_are_one_too_many(tmp_path) -> None:
    answer, seen = await _one(tmp_path, [("traceparent", GOOD), ("traceparent", GOOD)])
    assert answer.status == 200
    assert TRACE not in seen["traceparent"]


async def test_a_malformed_tracestate_is_dropped_and_a_good_one_kept(tmp_path) -> None:
    _, seen = await _one(tmp_path, [("traceparent", GOOD), ("tracestate", "x" * 600)])
    assert seen["traceparent"] == GOOD and "tracestate" not in seen
    _, seen = await _one(tmp_path, [("traceparent", GOOD), ("tracestate", "congo=t61rcWkgMzE")])
    assert seen["tracestate"] == "congo=t61rcWkgMzE"


async def _traced(tmp_path, traceparent: str, tracing_toml: str = ""):
    """One chat request carrying `traceparent` through a router whose spans go to an
    in-memory exporter: (the answer, the spans, the engine's headers by lowercase name, the
    spans started)."""
    engine = RecordingEngine()
    memory = InMemorySpanExporter()
    top = '[tracing]\notlp_endpoint = "http://127.0.0.1:9/v1/traces"\n' + tracing_toml
    async with scripted_backend(engine) as url:
        async with router_server(secure_toml(url, top=top), tmp_path) as server:
            with spans_to(server, memory) as tracing:
                tracing.tracer = counting = CountingTracer(tracing.tracer)
                answer = await send_raw(
                    f"http://127.0.0.1:{server.port}", [("traceparent", traceparent)], chat()
                )
    seen = {k.lower(): v for k, v in engine.seen[0][1].items()}
    return answer, memory.get_finished_spans(), seen, counting.started


class CountingTracer:
    """The SDK's tracer, counting the spans the router starts (recorded or not)."""

    def __init__(self, tracer) -> None:
        self.tracer, self.started = tracer, 0

    def start_as_current_span(self, *args, **kwargs):
        self.started += 1
        return self.tracer.start_as_current_span(*args, **kwargs)


async def test_with_tracing_on_a_forged_context_starts_a_new_trace(tmp_path) -> None:
    """With spans recorded (an in-memory exporter), a malformed parent is not adopted: the
    router's request span is a root of a trace of its own, and the engine's parent is the
    attempt span of that trace."""
    answer, finished, seen, started = await _traced(tmp_path, BAD_PARENTS[0])
    assert answer.status == 200 and started == len(finished)  # each span it started, kept
    spans = {s.name: s for s in finished}
    root = spans["POST /v1/chat/completions"]
    assert root.parent is None
    attempt = spans["gpuroute.attempt"]
    trace_id = f"{root.context.trace_id:032x}"
    assert seen["traceparent"].split("-")[1:3] == [trace_id, f"{attempt.context.span_id:016x}"]


async def test_the_global_tier_replaces_them_too_and_passes_its_own_id_on(tmp_path) -> None:
    """The global tier, too, answers and passes on an id of its own for each request, never
    the client's (issue 42 finding 10: a valid one is only logged, as client_request_id)."""
    from support.global_tier import global_tier

    router = RecordingEngine()  # stands in for the region's router
    async with scripted_backend(router) as region:
        async with global_tier(tmp_path, region) as (url, _app):
            bad = await send_raw(url, [("X-Request-Id", BAD_IDS[3]), ("traceparent", "x")], chat())
            good = await send_raw(url, [("X-Request-Id", "abc-1"), ("traceparent", GOOD)], chat())
    assert bad.status == good.status == 200
    first, second = ({k.lower(): v for k, v in h.items()} for _, h, _ in router.seen)
    assert FRESH_ID.fullmatch(bad.headers["x-request-id"])
    assert first["x-request-id"] == bad.headers["x-request-id"]
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", first["traceparent"])
    assert second["x-request-id"] == good.headers["x-request-id"]
    assert FRESH_ID.fullmatch(second["x-request-id"])  # its own, not "abc-1"
    assert second["traceparent"] == GOOD  # valid, tracing off: passed on as it came


async def test_a_reused_id_in_flight_does_not_break_the_other_request(tmp_path) -> None:
    """Request ids key the router's requests in flight: a second request carrying the id of
    one in flight (a client's retry, or someone who learnt another tenant's id) got a 500
    from the duplicate key. Now each request has the router's own id, and both answer."""
    import asyncio

    engine = RecordingEngine()
    engine.hold = asyncio.Event()
    async with scripted_backend(engine) as url:
        async with router_server(secure_toml(url), tmp_path) as server:
            base = f"http://127.0.0.1:{server.port}"
            first = asyncio.create_task(send_raw(base, [("X-Request-Id", "same")], chat()))
            while engine.started < 1:
                await asyncio.sleep(0.01)
            second = asyncio.create_task(send_raw(base, [("X-Request-Id", "same")], chat()))
            while engine.started < 2:
                await asyncio.sleep(0.01)
            engine.hold.set()
            answers = await asyncio.gather(first, second)
    assert [a.status for a in answers] == [200, 200]
    ids = [a.headers["x-request-id"] for a in answers]
    assert all(FRESH_ID.fullmatch(rid) for rid in ids) and ids[0] != ids[1]


async def test_a_passthrough_engine_gets_an_id_of_its_own_too(tmp_path) -> None:
    engine = RecordingEngine()
    async with scripted_backend(engine) as url:
        text = secure_toml(url, top='passthrough_paths = ["/v1/load_lora_adapter"]')
        async with router_server(text, tmp_path) as server:
            base = f"http://127.0.0.1:{server.port}"
            answer = await send_raw(
                base, [("X-Request-Id", "pt-1")], b"{}", "/v1/load_lora_adapter"
            )
    rid = answer.headers["x-request-id"]
    assert answer.status == 200 and FRESH_ID.fullmatch(rid)  # the router's own (finding 10)
    seen = {k.lower(): v for k, v in engine.seen[0][1].items()}
    assert re.fullmatch(rf"{rid}-0-[0-9a-f]{{8}}", seen["x-request-id"])


async def test_a_trace_not_sampled_records_nothing_and_tells_the_engine_so(tmp_path) -> None:
    """sample_ratio 0: the client's sampled flag is not trusted, no span is recorded (none
    below the request's either: they cost the request path for nothing), and the engine
    gets the same trace with the flag cleared, as its own request id."""
    answer, finished, seen, started = await _traced(tmp_path, GOOD, "sample_ratio = 0.0")
    assert answer.status == 200
    assert finished == () and started == 1  # the request's span alone, not recorded
    version, trace_id, parent, flags = seen["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE, "00") and FRESH_ID.fullmatch(parent)
    assert seen["x-request-id"].startswith(answer.headers["x-request-id"] + "-0-")
