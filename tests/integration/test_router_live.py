"""The router against real fake-engine processes and scripted loopback servers."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from support.live import (
    MODEL,
    async_wait_for,
    backends_state,
    chat_body,
    fake_engines,
    free_port,
    router_toml,
    running_router,
    scripted_backend,
)

pytestmark = pytest.mark.asyncio

SSE_SCRIPT = [
    b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a\\u00e9"}}]}\n',
    b'\ndata: {"id":"x","choices":[{"index":0,"delta":{"content":" b"},'
    b'"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


async def sse_script(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in SSE_SCRIPT:
        await response.write(chunk)
    await response.write_eof()
    return response


async def test_stream_passes_through_byte_for_byte(tmp_path) -> None:
    async with scripted_backend(sse_script) as upstream:
        config = router_toml([(upstream, "H100")])
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json=chat_body(stream=True)) as r:
                assert r.status == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                assert await r.read() == b"".join(SSE_SCRIPT)


async def test_requests_reuse_keep_alive_connections_to_the_engine(tmp_path) -> None:
    """Ten requests in turn open one connection to the engine, and the metric says so (no
    active health checks: they share the pool, and one landing while a request holds the
    connection would open a second)."""
    async with scripted_backend(sse_script) as upstream:
        config = router_toml([(upstream, "H100")], health="interval_s = 0")
        async with running_router(config, tmp_path) as (url, router):
            async with aiohttp.ClientSession() as s:
                for _ in range(10):
                    async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
                        assert r.status == 200 and await r.read() == b"".join(SSE_SCRIPT)
            origin = upstream.removeprefix("http://")
            opened = router.metrics.registry.get_sample_value
            labels = {"origin": origin, "why": "empty"}
            assert opened("gpuroute_upstream_connections_opened_total", labels) == 1.0


async def test_real_engine_stream_has_vllm_shape_and_usage(tmp_path) -> None:
    with fake_engines(("A100", 1.0)) as (engine,):
        config = router_toml([(engine.url, "A100")])
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            body = chat_body(stream=True, max_tokens=5) | {
                "stream_options": {"include_usage": True}
            }
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                text = (await r.read()).decode()
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        content = "".join(
            c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]
        )
        assert content == " tok" * 5
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


async def test_connect_error_and_5xx_are_retried_on_another_backend(tmp_path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"

    async def fail(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "boom"}}, status=500)

    with fake_engines(("H100", 1.0)) as (engine,):
        async with scripted_backend(fail) as failing:
            # capacities make the broken backends look best, so they are tried first
            config = router_toml([(dead, "H100"), (failing, "H100"), (engine.url, "L4")])
            async with (
                running_router(config, tmp_path) as (url, router),
                aiohttp.ClientSession() as s,
            ):
                for _ in range(4):
                    async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
                        assert r.status == 200, await r.text()
                        assert r.headers["x-gpuroute-backend"] == f"127.0.0.1:{engine.port}"
                retries = router.metrics.retries
                assert sum(retries.labels(k)._value.get() for k in ("refused", "5xx")) >= 2


OFF = "enabled = false"


async def test_no_retry_after_first_byte_ends_with_an_sse_error_event(tmp_path) -> None:
    """With continuation off (tests/integration/test_stream_continuation.py has it on), a
    stream whose engine dies is never sent again: it ends with the error event."""
    attempts = []

    async def break_mid_stream(request: web.Request) -> web.StreamResponse:
        attempts.append(1)
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(SSE_SCRIPT[0])
        request.transport.abort()  # the engine dies with the stream half sent
        return response

    async with scripted_backend(break_mid_stream) as upstream:
        async with scripted_backend(sse_script) as healthy:
            config = router_toml([(upstream, "H100"), (healthy, "T4")], continuation=OFF)
            async with (
                running_router(config, tmp_path) as (url, router),
                aiohttp.ClientSession() as s,
            ):
                async with s.post(url + "/v1/chat/completions", json=chat_body(stream=True)) as r:
                    body = await r.read()
    assert len(attempts) == 1
    events = body.split(b"\n\n")
    assert events[0] + b"\n\n" == SSE_SCRIPT[0]
    error = json.loads(events[1].removeprefix(b"data: "))
    assert error["error"]["code"] == "upstream_stream_error"
    assert events[2] == b"data: [DONE]"
    assert router.metrics.stream_errors.labels(upstream.split("//")[1])._value.get() == 1


async def test_breaker_opens_then_half_open_probes_close_it(tmp_path) -> None:
    with fake_engines(("H100", 1.0), ("H100", 1.0)) as (flaky, steady):
        config = router_toml(
            [(flaky.url, "H100"), (steady.url, "H100")],
            breaker="failure_threshold = 3\ncooldown_s = 0.3\nprobes_to_close = 2",
            outlier="consecutive_failures = 1000",
        )
        flaky_id = f"127.0.0.1:{flaky.port}"
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            async with s.post(flaky.url + "/_fault", json={"error_rate": 1.0}) as r:
                assert r.status == 200
            for _ in range(12):
                async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
                    assert r.status == 200  # retried onto the steady engine
            state = (await backends_state(s, url))[flaky_id]
            assert state["breaker"] == "open" and state["state"] == "ejected"
            async with s.post(flaky.url + "/_fault", json={"clear": True}) as r:
                assert r.status == 200

            async def closed() -> bool:
                async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
                    assert r.status == 200
                return (await backends_state(s, url))[flaky_id]["breaker"] == "closed"

            await async_wait_for(closed, 15, "breaker to close after probes")


async def test_full_queue_answers_429_with_retry_after(tmp_path) -> None:
    with fake_engines(("L4", 10.0)) as (engine,):
        config = router_toml([(engine.url, "L4")], admission="max_queue = 1")
        config = config.replace(
            'models = ["llama-3.1-8b"]', 'models = ["llama-3.1-8b"]\nmax_inflight = 1'
        )
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:

            async def one() -> tuple[int, dict]:
                async with s.post(url + "/v1/chat/completions", json=chat_body(max_tokens=2)) as r:
                    return r.status, dict(r.headers) | {"body": await r.json()}

            results = await asyncio.gather(*(one() for _ in range(4)))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 200, 429, 429]
    refused = [h for status, h in results if status == 429]
    assert all(int(h["Retry-After"]) >= 1 for h in refused)
    assert all(h["body"]["error"]["type"] == "rate_limit_error" for h in refused)


async def test_client_disconnect_releases_the_ledger(tmp_path) -> None:
    with fake_engines(("L4", 20.0)) as (engine,):
        config = router_toml([(engine.url, "L4")])
        backend_id = f"127.0.0.1:{engine.port}"
        async with running_router(config, tmp_path) as (url, router), aiohttp.ClientSession() as s:
            response = await s.post(
                url + "/v1/chat/completions", json=chat_body(stream=True, max_tokens=500)
            )
            assert response.status == 200
            await response.content.readany()
            assert router.scheduler.backends.get(backend_id).in_flight == 1
            response.close()  # the client goes away mid-stream

            async def released() -> bool:
                row = (await backends_state(s, url))[backend_id]
                return row["in_flight"] == 0 and row["outstanding_s"] == 0

            await async_wait_for(released, 10, "ledger release after disconnect")
            assert len(router.scheduler.ledger) == 0


async def test_no_backend_for_a_model_is_503_with_a_reason(tmp_path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = router_toml([(dead, "H100")], breaker="failure_threshold = 1\ncooldown_s = 60")
    async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
            assert r.status == 502
        async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "no_backend"
        async with s.get(url + "/readyz") as r:
            assert r.status == 503


BAD_INPUTS = [
    (b"{not json", {}, 400, None),
    (b"[1, 2]", {}, 400, None),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), {}, 400, "model"),
    (
        json.dumps(
            {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}
        ).encode(),
        {},
        404,
        "model",
    ),
    (json.dumps({"model": MODEL}).encode(), {}, 400, "messages"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), {}, 400, "messages"),
    (json.dumps({"model": MODEL, "messages": ["hi"]}).encode(), {}, 400, "messages"),
    (json.dumps(chat_body() | {"stream": "yes"}).encode(), {}, 400, "stream"),
    (json.dumps(chat_body() | {"max_tokens": -3}).encode(), {}, 400, "max_tokens"),
    (
        json.dumps(chat_body()).encode(),
        {"x-gpuroute-priority": "urgent"},
        400,
        "x-gpuroute-priority",
    ),
    (json.dumps(chat_body()).encode(), {"x-gpuroute-deadline-ms": "soon"}, 400, None),
    (b"x" * 70_000, {}, 413, None),
]


async def test_bad_inputs_get_openai_errors_never_500(tmp_path) -> None:
    with fake_engines(("H100", 1.0)) as (engine,):
        config = router_toml([(engine.url, "H100")], limits="max_body_bytes = 65536")
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            for body, headers, status, param in BAD_INPUTS:
                headers = {"Content-Type": "application/json", **headers}
                async with s.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                    payload = await r.json()
                    assert r.status == status, (body[:60], payload)
                    assert set(payload["error"]) == {"message", "type", "param", "code"}
                    assert payload["error"]["param"] == param


async def test_requests_stuck_on_a_backend_that_went_silent_are_moved(tmp_path) -> None:
    silent_hits = []

    async def silent(request: web.Request) -> web.Response:
        silent_hits.append(1)
        await request.read()
        await asyncio.Event().wait()  # a gray failure: accepts, never answers
        raise AssertionError("unreachable")

    with fake_engines(("H100", 1.0)) as (engine,):
        async with scripted_backend(silent) as stuck:
            config = router_toml([(engine.url, "H100"), (stuck, "H100")])
            async with running_router(config, tmp_path) as (url, router):
                async with aiohttp.ClientSession() as s:

                    async def one() -> int:
                        async with s.post(url + "/v1/chat/completions", json=chat_body()) as r:
                            await r.read()
                            return r.status

                    statuses = await asyncio.wait_for(
                        asyncio.gather(*(one() for _ in range(20))), 60
                    )
                assert statuses == [200] * 20
                assert len(silent_hits) >= 3 and router.watch.rescues == len(silent_hits)
                stuck_id = stuck.split("//")[1]
                # it was past rescue_slowness (10) when each rescue happened; it may have
                # decayed a little since, on a busy machine: still far from healthy (1.0)
                assert router.scheduler.backends.get(stuck_id).slowness >= 5


async def test_usage_chunk_stripped_unless_asked_for(tmp_path) -> None:
    """The router asks every stream for usage; a client that did not ask never sees it."""
    with fake_engines(("A100", 1.0)) as (engine,):
        config = router_toml([(engine.url, "A100")])
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            got = {}
            for asked in (False, True):
                body = chat_body(stream=True, max_tokens=4)
                if asked:
                    body["stream_options"] = {"include_usage": True}
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    got[asked] = (await r.read()).decode()
    for asked, text in got.items():
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        usage_only = [c for c in chunks if c["choices"] == []]
        assert len(usage_only) == int(asked), text
        assert all(c["choices"] for c in chunks) or asked
