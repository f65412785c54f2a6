"""An OTLP/HTTP traces endpoint that only counts what it receives, for benchmarks that
measure what exporting spans costs the router (`gpuroute bench overhead`): any Collector
would do, but this one needs no Go build and reports how many spans arrived, which shows
the tracing under test was really on.

    python -m gpuroute.testbed.otlp_sink --port PORT

POST /v1/traces takes an ExportTraceServiceRequest (protobuf, as the SDK's exporter sends
it); GET /count answers {"exports": N, "spans": M}."""

from __future__ import annotations

import argparse

from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

EMPTY_ANSWER = ExportTraceServiceResponse().SerializeToString()


class SpanCounter:
    """What the sink has received so far."""

    def __init__(self) -> None:
        self.exports = 0
        self.spans = 0

    async def receive(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        try:
            export.ParseFromString(await request.read())
        except DecodeError:  # the exporter must hear it
            return web.Response(status=400, text="not an ExportTraceServiceRequest")
        self.exports += 1
        self.spans += sum(
            len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans
        )
        return web.Response(body=EMPTY_ANSWER, content_type="application/x-protobuf")

    async def count(self, _: web.Request) -> web.Response:
        return web.json_response({"exports": self.exports, "spans": self.spans})


def sink_app() -> web.Application:
    counter = SpanCounter()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", counter.receive)
    app.router.add_get("/count", counter.count)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(sink_app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
