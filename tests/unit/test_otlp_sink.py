"""The benchmark's OTLP sink counts the spans the SDK's own exporter sends it (the proof,
in `bench overhead`, that tracing was on), and refuses what is not an export."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from gpuroute.testbed.otlp_sink import sink_app
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def three_spans() -> bytes:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("outer"):
        with tracer.start_as_current_span("inner"):
            pass
    with tracer.start_as_current_span("other"):
        pass
    return encode_spans(memory.get_finished_spans()).SerializeToString()


@pytest.mark.asyncio
async def test_the_sink_counts_exported_spans_and_refuses_garbage() -> None:
    async with TestClient(TestServer(sink_app())) as client:
        for _ in range(2):
            answer = await client.post("/v1/traces", data=three_spans())
            assert answer.status == 200
            assert answer.content_type == "application/x-protobuf"
        refused = await client.post("/v1/traces", data=b"\xff\xff not protobuf")
        assert refused.status == 400
        counted = await (await client.get("/count")).json()
    assert counted == {"exports": 2, "spans": 6}
