"""Continuation in the global tier with real processes: two regions (eu-west in the eu,
us-east in the us), each a `gpuroute router` child process over a fake engine process,
checking the global tier's signed residency decisions; the global tier in front. A region's
router is SIGKILLed while streams run through it: each stream goes on in the other region
as one answer (the official `openai` client and raw SSE), unless its residency allows no
other region or it cannot be continued faithfully (n > 1): then the explicit error event,
and nothing reaches the other region."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from openai import APIError, AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from support.broken_streams import events
from support.global_tier import (
    DECISION_KEY,
    EU_KEY,
    FIRST,
    RESIDENCY,
    global_over,
    router_process,
)
from support.live import (
    MODEL,
    STREAM_BROKE,
    FakeEngineProcess,
    async_wait_for,
    counter,
    holds,
)
from support.live import stream_error as error_of

pytestmark = pytest.mark.asyncio
JURISDICTION = {"eu-west": "eu", "us-east": "us"}
TOKENS = 60  # each answer: 60 events of " tok", one every 50 ms (3 s)
ENGINE = ("--token-interval-ms", "50", "--default-output-tokens", "1000")
ANSWER = " tok" * TOKENS
STARTED = 3  # events a stream has before the kill


@contextlib.asynccontextmanager
async def two_regions(tmp_path):
    """The global tier's URL and app, the routers and the engines by region."""
    engines: dict[str, FakeEngineProcess] = {}
    try:
        for region in JURISDICTION:
            engines[region] = FakeEngineProcess("H100", extra=ENGINE)
        routers = {}
        with contextlib.ExitStack() as stack:
            for region, engine in engines.items():
                backend = (
                    f'[[backends]]\nurl = "{engine.url}"\ngpu = "H100"\nmodels = ["{MODEL}"]\n'
                )
                decisions = (f'jurisdiction = "{JURISDICTION[region]}"\ndecision_key = '
                             f'"{DECISION_KEY}"\nrequire_global_decision = true\n')  # fmt: skip
                routers[region] = stack.enter_context(
                    router_process(tmp_path, region, backend, decisions)
                )
            urls = {region: router.url for region, router in routers.items()}
            async with global_over(tmp_path, urls, RESIDENCY) as (url, app):
                yield url, app, routers, engines
    finally:
        for engine in engines.values():
            engine.stop()


def body(**extra) -> dict:
    return {"model": MODEL, "stream": True, "max_tokens": TOKENS,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count for me"}], **extra}  # fmt: skip


async def raw_stream(url: str, progress: dict, i: int, sent: dict, headers: dict) -> bytes:
    """One stream read as raw SSE, its events counted in `progress[i]` as they come."""
    progress[i], out = 0, b""
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=sent, headers=headers) as r:
            assert r.status == 200
            async for data in r.content.iter_any():
                out += data
                progress[i] = out.count(b"data: ")
    return out


async def sdk_stream(url: str, progress: dict, i: int) -> tuple[str, list[str], set[str]]:
    """One stream read by the official client: its text, finish reasons (`error` where
    the client raised the stream's error event) and ids."""
    progress[i] = 0
    client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-any", max_retries=0,
                         default_headers=FIRST)  # fmt: skip
    pieces: list[str] = []
    finishes: list[str | None] = []
    ids: set[str] = set()
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "count for me"}],
            max_tokens=TOKENS, stream=True,
        )  # fmt: skip
        async for part in stream:
            progress[i] += 1
            ids.add(part.id)
            if part.choices:
                pieces.append(part.choices[0].delta.content or "")
                finishes.append(part.choices[0].finish_reason)
    except APIError:
        finishes.append("error")
    finally:
        await client.close()
    return "".join(pieces), [f for f in finishes if f], ids


def whole_raw(raw: bytes) -> bool:
    """One answer: one id, one role chunk, the text without gap or repeat, one finish,
    usage for all of it, [DONE], and no error."""
    if b'"error"' in raw or not raw.endswith(b"data: [DONE]\n\n"):
        return False
    chunks = events(raw)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join(c["delta"].get("content") or "" for c in choices)
    finishes = [c["finish_reason"] for c in choices if c["finish_reason"]]
    return (
        len({c["id"] for c in chunks}) == 1
        and sum("role" in c["delta"] for c in choices) == 1
        and (text, finishes) == (ANSWER, ["length"])
        and chunks[-1]["usage"]["completion_tokens"] == TOKENS
    )


async def engine_requests(engine: FakeEngineProcess) -> float:
    """Requests the engine took and finished (or saw aborted)."""
    async with aiohttp.ClientSession() as s:
        async with s.get(engine.url + "/metrics") as r:
            text = await r.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


def counted(app, reason: str, outcome: str) -> float:
    return counter(app, "gpuroute_global_stream_continuations", reason=reason, outcome=outcome)


async def test_streams_on_a_killed_regions_router_all_complete_elsewhere(tmp_path) -> None:
    n_sdk = n_raw = 8
    async with two_regions(tmp_path) as (url, app, routers, engines):
        progress: dict[int, int] = {}
        tasks = [asyncio.create_task(sdk_stream(url, progress, i)) for i in range(n_sdk)]
        tasks += [
            asyncio.create_task(raw_stream(url, progress, n_sdk + i, body(), FIRST))
            for i in range(n_raw)
        ]
        under_way = holds(lambda: len(progress) == len(tasks) and min(progress.values()) >= STARTED)
        await async_wait_for(under_way, 30, "every stream under way")
        in_flight = sum(not t.done() for t in tasks)
        routers["eu-west"].kill()
        async with asyncio.timeout(60):
            results = await asyncio.gather(*tasks)
        continued = counted(app, "region_broke", "continued")
        taken = await engine_requests(engines["us-east"])
    whole = [r[:2] == (ANSWER, ["length"]) and len(r[2]) == 1 for r in results[:n_sdk]]
    whole += [whole_raw(r) for r in results[n_sdk:]]
    lost = whole.count(False)
    print(f"\nglobal continuation: {in_flight} streams in flight on the killed router, {lost} lost")
    assert (in_flight, lost) == (len(tasks), 0)
    assert continued == len(tasks) and taken == len(tasks)  # each continued once, in us-east


@pytest.mark.parametrize(
    ("headers", "extra", "reason"),
    [({"Authorization": f"Bearer {EU_KEY}"}, {}, "no_region"), (FIRST, {"n": 2}, "n")],
    ids=["eu_only_tenant", "n_2"],
)
async def test_a_stream_that_cannot_go_on_ends_with_the_error_and_goes_nowhere(
    tmp_path, headers, extra, reason
) -> None:
    """Beside an unrestricted stream (which goes on in us-east, so that region was there
    to take it), a stream that may not or cannot go on ends with the error event; us-east's
    engine took the other stream alone."""
    async with two_regions(tmp_path) as (url, app, routers, engines):
        progress: dict[int, int] = {}
        stopped = asyncio.create_task(raw_stream(url, progress, 0, body(**extra), headers))
        control = asyncio.create_task(raw_stream(url, progress, 1, body(), FIRST))
        under_way = holds(lambda: len(progress) == 2 and min(progress.values()) >= STARTED)
        await async_wait_for(under_way, 30, "both streams under way")
        routers["eu-west"].kill()
        async with asyncio.timeout(60):
            raw, other = await asyncio.gather(stopped, control)
        assert (counted(app, reason, "ended"), counted(app, "region_broke", "continued")) == (1, 1)
        assert await engine_requests(engines["us-east"]) == 1
        assert (
            counter(app, "gpuroute_global_requests", region="us-east", reason="continuation") == 1
        )
    assert whole_raw(other)
    relayed = raw[: raw.rindex(b'data: {"error"')]
    error = error_of(raw, relayed)
    assert error.pop("message") == "region eu-west failed mid-stream" and error == STREAM_BROKE
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events(relayed))
    assert len(text) >= 4 and text == " tok" * (len(text) // 4)  # it had begun, whole events
