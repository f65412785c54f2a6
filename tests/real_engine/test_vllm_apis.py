"""The router in front of one real vLLM on the APIs beyond chat: Anthropic's Messages API
and OpenAI's Responses API through their official clients, a follow-up turn carried by
the router's own state, and the tokenizer routes."""

from __future__ import annotations

import aiohttp
import anthropic
import openai
import pytest
from support.live import router_toml, running_router
from support.real_engine import SERVED

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]
HI = [{"role": "user", "content": "route this to the engine, please"}]


def one_engine(vllm) -> str:
    return router_toml([(vllm.url, "L4")], model=SERVED)


async def test_anthropic_messages_through_the_router(vllm, tmp_path) -> None:
    async with running_router(one_engine(vllm), tmp_path) as (url, _):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
        try:
            reply = await client.messages.create(model=SERVED, max_tokens=8, messages=HI)
            assert reply.type == "message" and reply.usage.output_tokens >= 1
            async with client.messages.stream(model=SERVED, max_tokens=8, messages=HI) as s:
                pieces = [piece async for piece in s.text_stream]
                final = await s.get_final_message()
            assert final.usage.output_tokens >= 1 and final.stop_reason is not None
            assert len(pieces) >= 1
            with pytest.raises(anthropic.BadRequestError):
                await client.messages.create(model=SERVED, max_tokens=8, messages=[])
        finally:
            await client.close()


async def test_responses_two_turns_through_the_router(vllm, tmp_path) -> None:
    async with running_router(one_engine(vllm), tmp_path) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        try:
            first = await client.responses.create(model=SERVED, input="hello", max_output_tokens=8)
            assert first.status in ("completed", "incomplete")  # incomplete: max_output_tokens
            assert first.usage.output_tokens >= 1
            second = await client.responses.create(
                model=SERVED, input="and again", previous_response_id=first.id,
                max_output_tokens=8, stream=True,
            )  # fmt: skip
            done = None
            async for event in second:
                if event.type == "response.completed":
                    done = event.response
            assert done is not None and done.usage.input_tokens > first.usage.input_tokens
            fetched = await client.responses.retrieve(first.id)
            assert fetched.id == first.id
        finally:
            await client.close()


async def test_tokenize_goes_to_a_backend_of_the_model(vllm, tmp_path) -> None:
    async with running_router(one_engine(vllm), tmp_path) as (url, _), aiohttp.ClientSession() as s:
        async with s.post(url + "/tokenize", json={"model": SERVED, "prompt": "hello"}) as r:
            assert r.status == 200
            body = await r.json()
            assert body["count"] == len(body["tokens"]) >= 1
