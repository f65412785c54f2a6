"""A real vLLM that dies mid-stream, and one whose KV cache is too small for its load: the
client learns of the crash from an SSE error event, and the router sees the KV pressure
(waiting requests, preemptions) through the node agent."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from gpuroute.testbed.real_vllm import VllmOptions, engine_samples, start_vllm
from support.live import (
    STREAM_BROKE,
    AgentProcess,
    async_wait_for,
    backends_state,
    membership_toml,
    router_toml,
    running_router,
)
from support.real_engine import SERVED, need_vllm, vllm_agent_toml

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]


async def test_sigkill_of_vllm_mid_stream_ends_the_stream_with_an_error_event(tmp_path) -> None:
    need_vllm()
    engine = start_vllm(tmp_path, VllmOptions(max_num_seqs=4))
    body = {"model": SERVED, "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 1900, "stream": True, "ignore_eos": True}  # fmt: skip
    try:
        async with running_router(router_toml([(engine.url, "L4")], model=SERVED), tmp_path) as (
            url,
            _,
        ):
            async with (
                aiohttp.ClientSession() as s,
                s.post(url + "/v1/chat/completions", json=body) as r,
            ):
                assert r.status == 200
                events: list[bytes] = []
                async for line in r.content:
                    if line.startswith(b"data: "):
                        events.append(line[6:].strip())
                        if len(events) == 10:
                            engine.kill()  # the API server and its engine processes
    finally:
        engine.stop()
    payloads = events[:-1] if events[-1] == b"[DONE]" else events
    last = json.loads(payloads[-1])
    print(f"\nvLLM killed mid-stream: {len(events)} events, the last: {payloads[-1][:200]!r}")
    assert list(last) == ["error"], "the stream ended without an error event"
    error = last["error"]
    assert error.pop("message") and error == STREAM_BROKE
    assert events[-1] == b"[DONE]"
    assert not any(b'"finish_reason":"length"' in e for e in events)


async def test_kv_pressure_shows_in_the_routers_view_as_waiting_and_preemptions(
    consul, tmp_path
) -> None:
    need_vllm()
    # 8 blocks (vLLM counts room for 896 tokens): two of the 12 400-token requests below at a
    # time, so four wait from the start and the running ones preempt each other as they grow
    # (kept small: 24 requests of 1,000 tokens ran past 120 s on a loaded CI machine)
    engine = start_vllm(tmp_path, VllmOptions(max_num_seqs=8, kv_blocks=8, max_model_len=512))
    agent = AgentProcess(vllm_agent_toml(engine, consul.address, "kv"), tmp_path, "kv")
    body = {"model": SERVED, "messages": [{"role": "user", "content": "x" * 100}],
            "max_tokens": 300, "ignore_eos": True}  # fmt: skip
    try:
        config = membership_toml(consul.address)
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:

            async def routable() -> bool:
                row = (await backends_state(s, url)).get("kv", {})
                return row.get("state") in ("warming", "ready")

            await async_wait_for(routable, 30, "the engine routable")
            tasks = [asyncio.create_task(s.post(url + "/v1/chat/completions", json=body))
                     for _ in range(12)]  # fmt: skip
            seen = {"waiting": 0, "preemptions": 0.0}

            async def pressure_seen() -> bool:
                report = (await backends_state(s, url))["kv"]["agent"] or {"waiting": 0}
                seen["waiting"] = max(seen["waiting"], report["waiting"])
                return all(t.done() for t in tasks)

            await async_wait_for(pressure_seen, 120, "the requests answered")
            for response in await asyncio.gather(*tasks):
                assert response.status == 200
                await response.read()
            engine_preemptions = engine_samples(engine.url)["vllm:num_preemptions_total"]

            async def preemptions_seen() -> bool:
                report = (await backends_state(s, url))["kv"]["agent"]
                seen["preemptions"] = report["preemptions"]
                return seen["preemptions"] == engine_preemptions

            await async_wait_for(preemptions_seen, 10, "vLLM's preemptions reported")
        print(f"\nKV pressure in the router's view: {seen}; vLLM's own preemptions "
              f"{engine_preemptions:.0f}")  # fmt: skip
        assert engine_preemptions > 0  # the KV cache was too small, as meant
        assert seen["waiting"] > 0
    finally:
        agent.stop()
        engine.stop()
