"""Two real vLLM servers, each with a node agent registering in a real Consul, and a router
that discovers them: vLLM's own metrics reach the router through the agents, prefix
affinity shows in vLLM's own prefix-cache counter, and a drain finishes every stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import string
import time

import aiohttp
import pytest
from gpuroute.testbed.real_vllm import VllmOptions, engine_samples, start_vllm
from support.live import (
    AgentProcess,
    async_wait_for,
    backends_state,
    membership_toml,
    router_toml,
    running_router,
)
from support.real_engine import SERVED, need_vllm, vllm_agent_toml

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]
AGENTS = ("gpu-a", "gpu-b")


@pytest.fixture(scope="module")
def vllm_pair(tmp_path_factory):
    """Two engines sharing one core (the other is left to the agents, Consul and the
    router), with room for prompts of several router prefix blocks."""
    need_vllm()
    workdir = tmp_path_factory.mktemp("vllm-pair")
    engines = []
    try:
        for _ in range(2):
            engines.append(start_vllm(workdir, VllmOptions(max_model_len=8192)))
        yield engines
    finally:
        for engine in engines:
            engine.stop()


@contextlib.asynccontextmanager
async def discovered(vllm_pair, consul, tmp_path):
    """An agent per engine registering in Consul, and a router that found both: yields its
    URL, a client session and the agents."""
    agents = [
        AgentProcess(vllm_agent_toml(e, consul.address, name), tmp_path, name)
        for e, name in zip(vllm_pair, AGENTS, strict=True)
    ]
    try:
        config = membership_toml(consul.address)
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:

            async def both_routable() -> bool:
                rows = await backends_state(s, url)
                return all(rows.get(a, {}).get("state") in ("warming", "ready") for a in AGENTS)

            await async_wait_for(both_routable, 30, "both agents' engines routable")
            yield url, s, agents
    finally:
        for agent in agents:
            agent.stop()


def prompt(prefix: str, rng: random.Random) -> str:
    return prefix + " " + "".join(rng.choices(string.ascii_lowercase, k=40))


async def send(s: aiohttp.ClientSession, url: str, text: str, max_tokens: int = 4) -> str:
    body = {"model": SERVED, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "ignore_eos": True}  # fmt: skip
    async with s.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-gpuroute-backend"]


def hit_counters(engines) -> tuple[float, float]:
    hits = queries = 0.0
    for e in engines:
        m = engine_samples(e.url)
        hits += m["vllm:prefix_cache_hits_total"]
        queries += m["vllm:prefix_cache_queries_total"]
    return hits, queries


async def prefix_hit_rate(engines, url: str, seed: int) -> float:
    """vLLM's own prefix-cache hit rate over 7 conversations of 6 turns (a 6 kB system
    prompt each, three of the router's prefix blocks), sent one at a time in turn (an odd
    number, so that round robin's rotation does not line up with the conversations)."""
    rng = random.Random(seed)
    prefixes = ["".join(rng.choices(string.ascii_letters, k=6144)) for _ in range(7)]
    hits0, queries0 = hit_counters(engines)
    async with aiohttp.ClientSession() as s:
        for _ in range(6):
            for prefix in prefixes:
                await send(s, url, prompt(prefix, rng))
    hits, queries = hit_counters(engines)
    return (hits - hits0) / (queries - queries0)


async def test_prefix_affinity_raises_vllms_own_prefix_hit_rate(vllm_pair, tmp_path) -> None:
    backends = [(e.url, "L4") for e in vllm_pair]
    rates = {}
    for policy in ("round_robin", None):  # None: the router's default policy
        config = router_toml(backends, model=SERVED, policy=policy)
        async with running_router(config, tmp_path) as (url, _):
            rates[policy or "default"] = await prefix_hit_rate(vllm_pair, url, seed=len(rates))
    print(f"\nvLLM prefix-cache hit rate, 7 conversations x 6 turns on 2 engines: {rates}")
    assert rates["default"] > rates["round_robin"] + 0.05


async def test_vllm_metrics_reach_the_router_through_agents(vllm_pair, consul, tmp_path) -> None:
    async with discovered(vllm_pair, consul, tmp_path) as (url, s, _agents):
        rng = random.Random(7)
        prefix = "".join(rng.choices(string.ascii_letters, k=6144))
        for _ in range(4):
            await send(s, url, prompt(prefix, rng))
        engine_hits, _ = hit_counters(vllm_pair)

        async def agents_report_the_hits() -> bool:
            rows = await backends_state(s, url)
            seen = sum(rows[a]["agent"]["prefix_cache_hits"] for a in AGENTS)
            return seen >= engine_hits > 0

        await async_wait_for(agents_report_the_hits, 10, "prefix hits in the router's view")
        # load: vLLM's running count, through the agent, while streams run
        body = {"model": SERVED, "messages": [{"role": "user", "content": "go"}],
                "max_tokens": 6000, "ignore_eos": True}  # fmt: skip
        engine = vllm_pair[0].url + "/v1/chat/completions"  # sent to it directly
        tasks = [asyncio.create_task(s.post(engine, json=body)) for _ in range(6)]
        most = 0

        async def running_seen() -> bool:
            nonlocal most
            rows = await backends_state(s, url)
            most = max(most, sum(rows[a]["agent"]["running"] for a in AGENTS))
            return most >= 2 or all(t.done() for t in tasks)

        await async_wait_for(running_seen, 30, "vLLM's running requests in the router's view")
        for response in await asyncio.gather(*tasks):
            assert response.status == 200
            await response.read()
        assert most >= 2, await backends_state(s, url)
        rows = await backends_state(s, url)
        print("\nrouter's view of agent reports:",
              json.dumps({a: rows[a]["agent"] for a in AGENTS}))  # fmt: skip


async def test_drain_finishes_every_vllm_stream(vllm_pair, consul, tmp_path) -> None:
    body = {"model": SERVED, "messages": [{"role": "user", "content": "stream"}],
            "max_tokens": 2000, "stream": True, "ignore_eos": True}  # fmt: skip
    async with discovered(vllm_pair, consul, tmp_path) as (url, s, agents):

        async def stream() -> tuple[str, bytes]:
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                return r.headers["x-gpuroute-backend"], await r.read()

        streams = [asyncio.create_task(stream()) for _ in range(8)]

        async def in_flight_on_gpu_b() -> bool:
            return (await backends_state(s, url))["gpu-b"]["in_flight"] > 0

        await async_wait_for(in_flight_on_gpu_b, 10, "streams running on gpu-b")
        started = time.monotonic()
        drain = asyncio.create_task(asyncio.to_thread(agents[1].drain))

        async def draining() -> bool:
            return (await backends_state(s, url))["gpu-b"]["state"] == "draining"

        await async_wait_for(draining, 10, "the router sees gpu-b draining")
        late = [asyncio.create_task(stream()) for _ in range(4)]
        results = await asyncio.gather(*streams, *late)
        summary = json.loads((await drain).stdout)
    print(f"\ndrain of a real vLLM: {summary}, {time.monotonic() - started:.1f} s")
    assert summary["drained"] is True
    for _, text in results:  # every stream ran to its end: [DONE], no error event
        assert text.rstrip().endswith(b"data: [DONE]") and b'"error"' not in text
    assert any(backend == "gpu-b" for backend, _ in results[: len(streams)])  # drained these
    assert all(backend == "gpu-a" for backend, _ in results[len(streams) :])
