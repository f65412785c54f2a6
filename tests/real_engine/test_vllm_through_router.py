"""The router in front of one real vLLM, driven by the official `openai` client: answers,
streams, usage, errors and a client that leaves mid-stream, as vLLM itself sees them."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from gpuroute.testbed.real_vllm import engine_samples
from support.live import async_wait_for, backends_state, router_toml, running_router
from support.real_engine import SERVED, chat_prompt_tokens

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]
FIXED_LENGTH = {"ignore_eos": True}  # random weights may emit </s> early; count exactly


def one_engine(vllm) -> str:
    return router_toml([(vllm.url, "L4")], model=SERVED)


async def test_openai_client_answers_and_streams_with_vllms_usage(vllm, tmp_path) -> None:
    async with running_router(one_engine(vllm), tmp_path) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        try:
            assert [m.id for m in (await client.models.list()).data] == [SERVED]
            text = "route this to the engine, please"
            reply = await client.chat.completions.create(
                model=SERVED,
                messages=[{"role": "user", "content": text}],
                max_tokens=12,
                extra_body=FIXED_LENGTH,
            )
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage.completion_tokens == 12
            assert reply.usage.prompt_tokens == chat_prompt_tokens(text)

            stream = await client.chat.completions.create(
                model=SERVED,
                messages=[{"role": "user", "content": text}],
                max_tokens=20,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=FIXED_LENGTH,
            )
            deltas, finish, usage = 0, None, None
            async for chunk in stream:
                if chunk.choices:
                    deltas += bool(chunk.choices[0].delta.content)
                    finish = chunk.choices[0].finish_reason or finish
                usage = chunk.usage or usage
            assert finish == "length" and usage.completion_tokens == 20
            assert 1 <= deltas <= 20  # vLLM may merge tokens into one event when behind

            completion = await client.completions.create(
                model=SERVED, prompt="abc", max_tokens=5, extra_body=FIXED_LENGTH
            )
            assert completion.usage.prompt_tokens == 3 and completion.usage.completion_tokens == 5
        finally:
            await client.close()


async def test_vllms_own_request_errors_reach_the_client_and_spare_the_backend(
    vllm, tmp_path
) -> None:
    async with running_router(one_engine(vllm), tmp_path) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        try:
            for _ in range(5):  # more than any breaker's threshold
                with pytest.raises(openai.BadRequestError) as caught:
                    await client.chat.completions.create(
                        model=SERVED,
                        messages=[{"role": "user", "content": "x"}],
                        max_tokens=100_000,  # beyond the engine's 2,048-token context
                    )
                assert caught.value.status_code == 400
                assert caught.value.param == "max_tokens"  # vLLM's own error body, relayed
            backend = vllm.url.removeprefix("http://")  # a backend's id: host:port
            async with aiohttp.ClientSession() as s:
                assert (await backends_state(s, url))[backend]["state"] == "ready"
            reply = await client.chat.completions.create(
                model=SERVED,
                messages=[{"role": "user", "content": "ok"}],
                max_tokens=2,
                extra_body=FIXED_LENGTH,
            )
            assert reply.usage.completion_tokens == 2
        finally:
            await client.close()


async def test_a_client_that_leaves_mid_stream_is_aborted_in_vllm(vllm, tmp_path) -> None:
    before = engine_samples(vllm.url)
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "a long answer"}],
        "max_tokens": 1500,
        "stream": True,
        **FIXED_LENGTH,
    }
    async with running_router(one_engine(vllm), tmp_path) as (url, _):
        async with aiohttp.ClientSession() as s:
            response = await s.post(url + "/v1/chat/completions", json=body)
            assert response.status == 200
            events = 0
            async for line in response.content:
                events += line.startswith(b"data: ")
                if events == 5:
                    break
            assert engine_samples(vllm.url)["vllm:num_requests_running"] == 1
            response.close()  # the client goes away with ~1,495 tokens still to come

            async def aborted() -> bool:
                m = engine_samples(vllm.url)
                return m["vllm:num_requests_running"] == 0

            await async_wait_for(aborted, 15, "vLLM to stop the abandoned request")
    after = engine_samples(vllm.url)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    print(f"\nabandoned stream: vLLM generated {generated:.0f} of 1,500 tokens")
    assert generated < 1500
