"""Fallback through a live router: a heavy model (an 8B on an L4) that falls back to a light
one (a 3B on an H100). Saturated with long prompts, the heavy pool is predicted to miss an
interactive request's TTFT: requests that allow fallback are served by the light model
within their SLO; requests with `x-gpuroute-fallback: none` are refused, never served by
the light model. With the heavy model's engine down, the light one serves."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp
import pytest
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from support.live import (
    FakeEngineProcess,
    async_wait_for,
    backends_state,
    free_port,
    running_router,
)

from gpuroute.headers import FALLBACK_HEADER, SERVED_MODEL_HEADER

pytestmark = pytest.mark.asyncio
TTFT_S = 1.0  # the interactive class's; the heavy pool idle answers a probe in ~0.1 s
SLO = f"""default_class = "interactive"
[[slo.classes]]
name = "interactive"
ttft_s = {TTFT_S}
tpot_s = 0.5
[[slo.classes]]
name = "batch"
ttft_s = 300.0
tpot_s = 5.0
"""
MODELS = """[[models]]
name = "heavy"
shape = "llama-3.1-8b"
aliases = ["chat"]
fallback = ["light"]
slo_class = "interactive"
[[models]]
name = "light"
shape = "llama-3.2-3b"
"""
SATURATING, LONG_PROMPT = 6, 8000  # tokens: ~2.2 s of L4 prefill each, ~13 s queued


def router_config(heavy_url: str, light_url: str) -> str:
    return (
        ROUTER_ON_LOOPBACK + 'tick_s = 0.05\npolicy = "slo_aware"\n[listen]\nport = 0\n'
        f"[slo]\n{SLO}"
        f'[[backends]]\nurl = "{heavy_url}"\ngpu = "L4"\nmodels = ["heavy"]\n'
        f'[[backends]]\nurl = "{light_url}"\ngpu = "H100"\nmodels = ["light"]\n' + MODELS
    )


def body(tokens: int, tag: str, *, model: str = "heavy", max_tokens: int = 4) -> dict:
    """A streamed chat request whose prompt is about `tokens` long and unique to `tag` (so
    no prefix cache shortens its prefill)."""
    text = f"{tag} " + "abcd" * (tokens - 2)  # 4 characters a token (gpuroute/prompt.py)
    return {
        "model": model, "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens, "stream": True,
    }  # fmt: skip


@dataclass
class Answer:
    status: int
    served: str | None
    model: str | None  # the first chunk's `model`
    ttft_s: float | None  # to the first chunk
    code: str | None  # an error's code


async def ask(s: aiohttp.ClientSession, url: str, payload: dict, **headers: str) -> Answer:
    sent = time.monotonic()
    async with s.post(url + "/v1/chat/completions", json=payload, headers=headers) as r:
        served = r.headers.get(SERVED_MODEL_HEADER)
        if r.status != 200:
            return Answer(r.status, served, None, None, (await r.json())["error"]["code"])
        first = await r.content.readuntil(b"\n\n")
        ttft = time.monotonic() - sent
        rest = await r.read()
    assert rest.endswith(b"data: [DONE]\n\n"), rest[-200:]
    model = json.loads(first.removeprefix(b"data: "))["model"]
    return Answer(200, served, model, ttft, None)


def engines(*specs: tuple[str, str, str]) -> list[FakeEngineProcess]:
    """(gpu, shape, served name) each; the caller stops them."""
    return [
        FakeEngineProcess(gpu, extra=("--model", shape, "--served-name", name))
        for gpu, shape, name in specs
    ]


async def saturate(s: aiohttp.ClientSession, url: str) -> list[asyncio.Task]:
    """Long prompts on the heavy pool, in the lax class and without fallback (so they stay
    there), until the router has booked them all; the caller cancels them."""
    headers = {"x-gpuroute-slo": "batch", FALLBACK_HEADER: "none"}
    tasks = [
        asyncio.create_task(ask(s, url, body(LONG_PROMPT, f"long-{i}", max_tokens=64), **headers))
        for i in range(SATURATING)
    ]

    async def booked() -> bool:
        heavy = [b for b in (await backends_state(s, url)).values() if "heavy" in b["models"]]
        return heavy[0]["in_flight"] == SATURATING

    await async_wait_for(booked, 20, "the heavy pool saturated")
    return tasks


async def test_a_saturated_heavy_model_falls_back_unless_forbidden(tmp_path) -> None:
    fleet = engines(("L4", "llama-3.1-8b", "heavy"), ("H100", "llama-3.2-3b", "light"))
    saturating: list[asyncio.Task] = []
    try:
        config = router_config(fleet[0].url, fleet[1].url)
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            # idle, the heavy model meets the class itself (through its alias too)
            idle = [await ask(s, url, body(300, f"idle-{i}", model="chat")) for i in range(3)]
        # a router that has served no interactive request yet: while one is served, batch
        # work waits in the router rather than deepening an engine's queue (placement.py),
        # so the saturating requests would not all reach the engine
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            saturating = await saturate(s, url)
            started = time.monotonic()
            moved = [await ask(s, url, body(300, f"probe-{i}")) for i in range(5)]
            kept = [
                await ask(s, url, body(300, f"none-{i}"), **{FALLBACK_HEADER: "none"})
                for i in range(3)
            ]
            during = time.monotonic() - started
            bad = await ask(s, url, body(300, "bad"), **{FALLBACK_HEADER: "sometimes"})
            still = sum(not t.done() for t in saturating)
    finally:
        for task in saturating:
            task.cancel()
        await asyncio.gather(*saturating, return_exceptions=True)
        for engine in fleet:
            engine.stop()
    print(f"\nfallback: TTFTs {[round(a.ttft_s or 0, 3) for a in moved]} s on the light model, "
          f"forbidden {[(a.status, a.code) for a in kept]}, {during:.2f} s")  # fmt: skip
    assert [(a.status, a.served, a.model) for a in idle] == [(200, "heavy", "heavy")] * 3
    assert still == SATURATING  # the heavy pool stayed saturated while probed
    assert [(a.status, a.served, a.model) for a in moved] == [(200, "light", "light")] * 5
    assert all(a.ttft_s is not None and a.ttft_s < TTFT_S for a in moved)
    # forbidden to fall back: refused for the class, never served by the light model
    assert [(a.status, a.code, a.served) for a in kept] == [(429, "slo_unattainable", None)] * 3
    assert (bad.status, bad.code) == (400, None)


async def test_with_the_heavy_engine_down_the_light_model_serves(tmp_path) -> None:
    """No healthy backend for the heavy model (its engine's port refuses connections):
    fallback needs no prediction here, so it holds under the default policy too."""
    (light,) = engines(("H100", "llama-3.2-3b", "light"))
    try:
        config = router_config(f"http://127.0.0.1:{free_port()}", light.url)
        config = config.replace('policy = "slo_aware"\n', "")
        async with running_router(config, tmp_path) as (url, _), aiohttp.ClientSession() as s:
            served = [await ask(s, url, body(100, f"down-{i}")) for i in range(4)]
            none = [
                await ask(s, url, body(100, f"none-{i}"), **{FALLBACK_HEADER: "none"})
                for i in range(2)
            ]
    finally:
        light.stop()
    assert [(a.status, a.served, a.model) for a in served] == [(200, "light", "light")] * 4
    # the refused connections took the heavy backend out: nothing may serve these
    assert [(a.status, a.code, a.served) for a in none] == [(503, "no_backend", None)] * 2
