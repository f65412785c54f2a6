"""LoRA adapters on a real vLLM (the CPU build): two tiny PEFT adapters written offline
(testbed/real_vllm.py write_tiny_lora, random weights for the tiny model's q_proj and
v_proj) and served with --enable-lora. vLLM lists them as models whose parent is the base,
serves a completion for each, and exports vllm:lora_requests_info, whose labels the node
agent's parser (agent/engine_metrics.py) turns into the adapters in flight and the slots.

vLLM 0.32 sets that gauge on every engine step with a new label set, so a page holds every
set it has seen; the latest (the largest value, a timestamp) is its state now. Both label
lists name every adapter with a request waiting or running (a count of zero included), and
an idle engine's latest set names none: the gauge says which adapters are in use, not which
are loaded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest
from gpuroute.agent.engine_metrics import LORA_INFO, parse_engine_metrics
from gpuroute.testbed.real_vllm import VllmOptions, lora_flags, start_vllm, write_tiny_lora
from prometheus_client.parser import text_string_to_metric_families
from support.real_engine import SERVED, need_vllm

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]
ADAPTERS = ("support-bot", "sql-writer")
MAX_LORAS = 2
LABELS = {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}


@pytest.fixture(scope="module")
def lora_vllm(tmp_path_factory):
    """The tiny model with two adapters and two adapter slots (starts in ~40-60 s here)."""
    need_vllm()
    workdir = tmp_path_factory.mktemp("vllm-lora")
    model = workdir / "model-tiny"  # where start_vllm writes the tiny model
    adapters = {
        name: write_tiny_lora(workdir / f"lora-{name}", model, seed=i)
        for i, name in enumerate(ADAPTERS)
    }
    child = start_vllm(workdir, VllmOptions(extra=lora_flags(adapters, max_loras=MAX_LORAS)))
    yield child
    child.stop()


async def get_text(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url) as r:
        assert r.status == 200
        return await r.text()


async def page_when(s: aiohttp.ClientSession, url: str, adapters: set[str]) -> str:
    """The engine's /metrics once the agent's parser finds these adapters in flight (the
    gauge is set on the engine's next step, so a page may lag a request by one)."""
    deadline = time.monotonic() + 10
    while True:
        page = await get_text(s, url + "/metrics")
        if parse_engine_metrics(page, "vllm").lora_adapters == adapters:
            return page
        assert time.monotonic() < deadline, f"none names {adapters}: {lora_samples(page)}"
        await asyncio.sleep(0.1)


def lora_samples(page: str) -> list:
    return [
        sample
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == LORA_INFO
    ]


def names(label: str) -> set[str]:
    return {a for a in label.split(",") if a}


async def test_models_lists_each_adapter_with_the_base_model_as_its_parent(lora_vllm) -> None:
    async with aiohttp.ClientSession() as s:
        models = json.loads(await get_text(s, lora_vllm.url + "/v1/models"))["data"]
    parents = {m["id"]: m["parent"] for m in models}
    assert parents == {SERVED: None, **{a: SERVED for a in ADAPTERS}}


async def test_each_adapter_serves_a_completion_and_an_unknown_one_is_404(lora_vllm) -> None:
    async with aiohttp.ClientSession() as s:
        for model in (*ADAPTERS, SERVED):
            body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
            async with s.post(lora_vllm.url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                reply = await r.json()
            assert reply["model"] == model
            assert reply["usage"]["completion_tokens"] == 4
        body = {"model": "no-such-adapter", "prompt": "hello", "max_tokens": 4}
        async with s.post(lora_vllm.url + "/v1/completions", json=body) as r:
            assert r.status == 404
            assert "does not exist" in (await r.json())["error"]["message"]


async def test_lora_requests_info_names_the_adapters_in_flight_and_the_agent_parses_it(
    lora_vllm,
) -> None:
    """One stream per adapter (~3 s each here); the page is read while both run, then
    again once both are done."""
    body = {"prompt": "hi", "max_tokens": 300, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with contextlib.AsyncExitStack() as streams:
            responses = []
            for adapter in ADAPTERS:
                url = lora_vllm.url + "/v1/completions"
                r = await streams.enter_async_context(s.post(url, json={**body, "model": adapter}))
                assert r.status == 200
                responses.append(r)
            for r in responses:  # both admitted: each has sent its first token
                line = await r.content.readline()
                while not line.startswith(b"data: "):
                    assert line, "a stream ended before its first token"
                    line = await r.content.readline()
            busy = await page_when(s, lora_vllm.url, set(ADAPTERS))
            for r in responses:
                events = [line async for line in r.content if line.startswith(b"data: ")]
                assert events[-1].strip() == b"data: [DONE]"
        idle = await page_when(s, lora_vllm.url, set())
    print(f"\nvllm:lora_requests_info while both ran:\n{busy.count(LORA_INFO + '{')} label sets")
    for sample in lora_samples(busy):
        print(f"  {sample.labels} {sample.value:.3f}")

    latest = max(lora_samples(busy), key=lambda sample: sample.value)
    assert set(latest.labels) == LABELS
    assert latest.labels["max_lora"] == str(MAX_LORAS)
    assert names(latest.labels["running_lora_adapters"]) == set(ADAPTERS)
    assert names(latest.labels["waiting_lora_adapters"]) <= set(ADAPTERS)
    load = parse_engine_metrics(busy, "vllm")
    assert load.lora_adapters == frozenset(ADAPTERS)
    assert load.max_loras == MAX_LORAS
    assert load.running == 2

    # the page keeps the busy label sets; the latest, set as the last stream ended, is empty
    assert len(lora_samples(idle)) > 1
    now = max(lora_samples(idle), key=lambda sample: sample.value)
    assert now.labels == {"max_lora": str(MAX_LORAS), "running_lora_adapters": "",
                          "waiting_lora_adapters": ""}  # fmt: skip
    load = parse_engine_metrics(idle, "vllm")
    assert load.lora_adapters == frozenset()
    assert load.max_loras == MAX_LORAS
