"""One trace across the tiers, as processes (issue 34, "Tracing"): a client's request goes
through `gpuroute global` and `gpuroute router`, each exporting its spans over OTLP/HTTP to
a real OpenTelemetry Collector (built by `make otelcol`; its file exporter writes what it
received), to an engine that records the headers it got. Read back from the collector's
file: one trace id, the client's span → the global tier's span → the router's request span
→ its admission, pick and attempt spans → the engine's traceparent, whose parent is the
attempt's span. The request id the client sent comes back, reaches the router and reaches
the engine as an id of its attempt."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK, ROUTER_ON_LOOPBACK
from support.components import otelcol
from support.live import (
    MODEL,
    async_wait_for,
    chat_body,
    environ_without_proxies,
    free_ports,
    gpuroute_cmd,
    http_ok,
    scripted_backend,
    wait_for,
)
from support.paths import REPO

pytestmark = pytest.mark.asyncio
TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SERVER_SPAN = "POST /v1/chat/completions"
ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class RecordingEngine:
    """Answers like an OpenAI engine; records each request's path, headers and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []

    async def __call__(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, dict(request.headers), await request.read()))
        return web.json_response(ANSWER)


def collector_yaml(port: int, out: Path) -> str:
    return (
        f"receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n"
        f"exporters:\n  file:\n    path: {out}\n    flush_interval: 100ms\n"
        "service:\n  telemetry:\n    metrics:\n      level: none\n"
        "  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n"
    )


def spans_in(path: Path) -> list[dict]:
    """Every span the collector wrote (OTLP JSON, one export request a line), each with its
    service's name under "service" and its resource's `cloud.region` under "region"."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            request = json.loads(line)
        except json.JSONDecodeError:  # a line the collector is still writing
            continue
        for resource in request.get("resourceSpans", []):
            attributes = {a["key"]: a["value"] for a in resource["resource"]["attributes"]}
            service = attributes["service.name"]["stringValue"]
            region = attributes.get("cloud.region", {}).get("stringValue")
            for scope in resource.get("scopeSpans", []):
                out += [span | {"service": service, "region": region}
                        for span in scope.get("spans", [])]  # fmt: skip
    return out


def attributes(span: dict) -> dict:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


@contextlib.contextmanager
def processes(*commands: tuple[list[str], Path]):
    """Child processes, their output to log files; killed at the end."""
    procs = []
    try:
        for cmd, log in commands:
            procs.append(
                subprocess.Popen(
                    cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                    env=environ_without_proxies() | {"OTEL_BSP_SCHEDULE_DELAY": "100"},
                )
            )  # fmt: skip
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def tier_configs(tmp_path: Path, engine: str, ports: list[int]) -> tuple[Path, Path]:
    collector, router, report, front = ports
    tracing = f'[tracing]\notlp_endpoint = "http://127.0.0.1:{collector}/v1/traces"\n'
    router_toml = tmp_path / "router.toml"
    router_toml.write_text(
        ROUTER_ON_LOOPBACK + f"tick_s = 0.05\n[listen]\nport = {router}\n"
        f'[region]\nname = "eu-west"\nreport_period_s = 0.1\n'
        f"[region.report_listen]\nport = {report}\n{tracing}"
        f'[[backends]]\nurl = "{engine}"\ngpu = "H100"\nmodels = ["{MODEL}"]\n'
    )
    (tmp_path / "regions.toml").write_text((REPO / "regions.example.toml").read_text())
    global_toml = tmp_path / "global.toml"
    global_toml.write_text(
        GLOBAL_ON_LOOPBACK + 'regions_file = "regions.toml"\ntick_s = 0.05\n'
        f"[listen]\nport = {front}\n[region_health]\nup_after_s = 0.0\n{tracing}"
        f'[[endpoints]]\nregion = "eu-west"\nurl = "http://127.0.0.1:{router}"\n'
        f'report = "127.0.0.1:{report}"\n'
    )
    return router_toml, global_toml


async def test_one_trace_from_the_global_tier_through_the_router_to_the_engine(tmp_path) -> None:
    binary = otelcol()
    ports = free_ports(4)
    out = tmp_path / "spans.json"
    (tmp_path / "collector.yaml").write_text(collector_yaml(ports[0], out))
    engine = RecordingEngine()
    async with scripted_backend(engine) as engine_url:
        router_toml, global_toml = tier_configs(tmp_path, engine_url, ports)
        with processes(
            ([str(binary), "--config", str(tmp_path / "collector.yaml")], tmp_path / "otel.log"),
            (gpuroute_cmd("router", "--config", str(router_toml)), tmp_path / "router.log"),
            (gpuroute_cmd("global", "--config", str(global_toml)), tmp_path / "global.log"),
        ):
            front = f"http://127.0.0.1:{ports[3]}"
            wait_for(lambda: http_ok(f"{front}/readyz"), 30, "the global tier, a region up")
            headers = {
                "x-request-id": "trace-live-1",
                "traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01",
            }
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    f"{front}/v1/chat/completions", json=chat_body(), headers=headers
                ) as answer:
                    assert answer.status == 200, await answer.text()
                    answered = answer.headers["x-request-id"]  # the global tier's own id
                    assert re.fullmatch(r"[0-9a-f]{16}", answered)
            router_stages = ("gpuroute.admission", "gpuroute.pick", "gpuroute.attempt")
            needed = {("gpuroute-global", SERVER_SPAN), ("gpuroute-router", SERVER_SPAN)}
            needed |= {("gpuroute-router", stage) for stage in router_stages}

            async def all_spans_arrived() -> bool:
                return needed <= {(s["service"], s["name"]) for s in spans_in(out)}

            await async_wait_for(all_spans_arrived, 20, "every span the chain needs")
    check_chain(spans_in(out), engine, answered)


def check_chain(spans: list[dict], engine: RecordingEngine, answered: str) -> None:
    assert {s["traceId"] for s in spans} == {TRACE}  # one trace, the client's
    by = {(s["service"], s["name"]): s for s in spans}
    top = by[("gpuroute-global", SERVER_SPAN)]
    assert top["parentSpanId"] == CLIENT_SPAN
    assert attributes(top)["gpuroute.region"] == "eu-west"
    router = by[("gpuroute-router", SERVER_SPAN)]
    assert router["parentSpanId"] == top["spanId"]
    # every span of the router names its region (the resource's cloud.region)
    assert {s["region"] for s in spans if s["service"] == "gpuroute-router"} == {"eu-west"}
    # each tier's own id for the request, never the client's (issue 42 finding 10)
    assert attributes(top)["gpuroute.request_id"] == answered
    routers_id = attributes(router)["gpuroute.request_id"]
    assert re.fullmatch(r"[0-9a-f]{16}", routers_id) and routers_id != answered
    for stage in ("gpuroute.admission", "gpuroute.pick", "gpuroute.attempt"):
        assert by[("gpuroute-router", stage)]["parentSpanId"] == router["spanId"], stage
    pick = attributes(by[("gpuroute-router", "gpuroute.pick")])
    assert pick["gpuroute.chosen"] and pick["gpuroute.reason"]  # the decision's terms
    assert attributes(by[("gpuroute-router", "gpuroute.admission")])["gpuroute.admitted"]
    attempt = by[("gpuroute-router", "gpuroute.attempt")]
    events = {e["name"] for e in attempt.get("events", [])}
    assert events >= {"first_byte", "first_token", "stream_end"}
    [(_, seen, _)] = engine.seen
    got = {k.lower(): v for k, v in seen.items()}
    assert got["traceparent"] == f"00-{TRACE}-{attempt['spanId']}-01"
    # the router's own id for the request (the one it came with is any tenant's to reuse:
    # issue 42 finding 10), with the attempt and a nonce
    assert re.fullmatch(rf"{routers_id}-0-[0-9a-f]{{8}}", got["x-request-id"])
