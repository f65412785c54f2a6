"""Logs on live tiers (issue 34, item 3): a router process's JSON lines on stderr, its access
line naming the request the client was told of, `--log-level warning` hiding both, and the
request's id on a line some other logger writes while handling it; the global tier's access
line."""

from __future__ import annotations

import io
import json
import logging
import subprocess

import aiohttp
import pytest
from aiohttp import web
from support.global_tier import global_tier
from support.live import (
    MODEL,
    FakeEngineProcess,
    chat_body,
    free_port,
    gpuroute_cmd,
    http_ok,
    router_toml,
    running_router,
    scripted_backend,
    wait_for,
)

from gpuroute import logs

ACCESS_FIELDS = {
    "time", "level", "logger", "message", "request_id", "route", "status", "tenant", "model",
    "served_model", "backend", "prompt_tokens", "completion_tokens", "ttft_ms", "duration_ms",
    "sample_rate",
}  # fmt: skip


@pytest.fixture
def engine():
    engine = FakeEngineProcess("H100", time_scale=0.05)
    yield engine
    engine.stop()


def run_router(tmp_path, engine_url: str, *flags: str) -> tuple[list[dict | str], str]:
    """A router process with `flags`, asked one streamed chat; its stderr's lines (JSON
    objects parsed) and the request id its answer named."""
    port = free_port()
    config = tmp_path / "router.toml"
    config.write_text(router_toml([(engine_url, "H100")], port))
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            gpuroute_cmd("router", "--config", str(config), *flags),
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or http_ok(url + "/readyz"), 30, "router")
        import urllib.request

        body = json.dumps(chat_body(stream=True)).encode()
        request = urllib.request.Request(
            url + "/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
            request_id = answer.headers["x-request-id"]
            answer.read()
    finally:
        proc.terminate()
        proc.wait(30)
    out: list[dict | str] = []
    for line in stderr.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out, request_id


def test_router_process_writes_json_lines_and_an_access_line_per_request(tmp_path, engine) -> None:
    lines, request_id = run_router(tmp_path, engine.url, "--log-format", "json")
    assert lines and all(isinstance(line, dict) for line in lines), lines
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    (access,) = [line for line in lines if line["logger"] == "gpuroute.access"]
    assert set(access) >= ACCESS_FIELDS, ACCESS_FIELDS - set(access)
    assert access["request_id"] == request_id
    assert access["route"] == "/v1/chat/completions" and access["status"] == 200
    assert access["model"] == access["served_model"] == MODEL
    assert access["backend"] and access["tenant"]
    assert access["prompt_tokens"] > 0 and access["completion_tokens"] > 0
    assert 0 < access["ttft_ms"] <= access["duration_ms"]
    assert access["sample_rate"] == 1.0
    assert any(line["logger"] == "gpuroute.serving" for line in lines)  # its drain's too
    (listening,) = [line for line in lines if "listening on" in line["message"]]
    assert listening["url"].startswith("http://127.0.0.1:")  # a JSON line, its URL a field


def test_router_process_at_warning_writes_no_info(tmp_path, engine) -> None:
    lines, _ = run_router(tmp_path, engine.url, "--log-format", "json", "--log-level", "warning")
    assert all(line["level"] != "INFO" for line in lines if isinstance(line, dict)), lines
    assert all(isinstance(line, dict) for line in lines), lines


@pytest.fixture
def captured():
    """The process's logs as JSON lines into a buffer (configured as a command would)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    out = io.StringIO()
    logs.configure("info", "json", out)
    yield out
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def records(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def breaks_after_first_chunk(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
    request.transport.close()  # the engine dies mid-stream
    return response


@pytest.mark.asyncio
async def test_a_line_another_logger_writes_about_a_request_carries_its_id(
    tmp_path, captured
) -> None:
    async with scripted_backend(breaks_after_first_chunk) as upstream:
        config = router_toml([(upstream, "H100")])
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json=chat_body(stream=True)) as r:
                request_id = r.headers["x-request-id"]
                await r.read()
    lines = records(captured)
    broke = [line for line in lines if "broke after first byte" in line["message"]]
    assert broke and all(line.get("request_id") == request_id for line in broke), lines
    (access,) = [line for line in lines if line["logger"] == "gpuroute.access"]
    assert access["request_id"] == request_id and access["status"] == 200


USAGE_ANSWER = {
    "id": "x", "object": "chat.completion", "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
}  # fmt: skip


async def region_router(request: web.Request) -> web.Response:
    """A regional router's answer: its own request id on it."""
    await request.read()
    return web.json_response(USAGE_ANSWER, headers={"x-request-id": "00aa11bb22cc33dd"})


@pytest.mark.asyncio
async def test_global_tier_writes_an_access_line_with_the_regions_request_id(
    tmp_path, captured
) -> None:
    async with scripted_backend(region_router) as region:
        async with global_tier(tmp_path, region) as (url, _), aiohttp.ClientSession() as s:
            headers = {"x-request-id": "client-9"}
            async with s.post(url + "/v1/chat/completions", json=chat_body(), headers=headers) as r:
                assert r.status == 200
                passed_id = r.headers["x-request-id"]  # the global tier's own (tracing.py)
            async with s.post(url + "/v1/chat/completions", data=b"{not json") as r:
                assert r.status == 400
                refused_id = r.headers["x-request-id"]  # the global tier's own (tracing.py)
    access = [line for line in records(captured) if line["logger"] == "gpuroute.access"]
    ok, bad = access
    assert (ok["request_id"], ok["client_request_id"]) == (passed_id, "client-9")
    assert ok["router_request_id"] == "00aa11bb22cc33dd" and ok["region"] == "eu-west"
    assert (ok["status"], ok["model"], ok["route"]) == (200, MODEL, "/v1/chat/completions")
    assert 0 < ok["ttft_ms"] <= ok["duration_ms"] and ok["sample_rate"] == 1.0
    assert bad["status"] == 400 and bad["request_id"] == refused_id and bad["region"] is None
    assert bad["router_request_id"] is None and bad["client_request_id"] is None


@pytest.mark.asyncio
async def test_a_passthrough_request_and_a_refused_one_have_access_lines(
    tmp_path, captured
) -> None:
    async with scripted_backend(region_router) as upstream:
        config = router_toml([(upstream, "H100")])
        config = 'passthrough_paths = ["/v1/load_lora_adapter"]\n' + config
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/load_lora_adapter", json={"lora_name": "a"}) as r:
                assert r.status == 200
                passed_id = r.headers["x-request-id"]
            async with s.post(url + "/v1/chat/completions", json={"model": "nope"}) as r:
                assert r.status in (400, 404)
                refused_id = r.headers["x-request-id"]
    passed, refused = [line for line in records(captured) if line["logger"] == "gpuroute.access"]
    assert (passed["request_id"], passed["route"], passed["status"]) == (
        passed_id, "/v1/load_lora_adapter", 200,
    )  # fmt: skip
    assert passed["backend"] and passed["tenant"] and passed["model"] is None
    assert (passed["prompt_tokens"], passed["completion_tokens"]) == (7, 3)  # the usage's
    assert refused["request_id"] == refused_id and refused["status"] in (400, 404)
    assert refused["tenant"] is None and refused["backend"] is None
