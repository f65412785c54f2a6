"""The official `anthropic` package works unchanged against the router's Messages API:
streamed and not, token counting, and its own error classes for the router's refusals."""

from __future__ import annotations

import anthropic
import pytest
from support.live import MODEL, fake_engines, router_toml, running_router

pytestmark = pytest.mark.asyncio
HI = [{"role": "user", "content": "hi"}]


async def test_anthropic_client_streaming_and_not(tmp_path) -> None:
    with fake_engines(("H100", 1.0), ("A100", 1.0)) as engines:
        config = router_toml([(e.url, e.gpu) for e in engines])
        async with running_router(config, tmp_path) as (url, _):
            client = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
            try:
                reply = await client.messages.create(model=MODEL, max_tokens=6, messages=HI,
                                                     system="be brief")  # fmt: skip
                assert reply.type == "message" and reply.role == "assistant"
                assert reply.content[0].type == "text" and reply.content[0].text
                assert reply.usage.output_tokens == 6 and reply.usage.input_tokens >= 1

                async with client.messages.stream(model=MODEL, max_tokens=7, messages=HI) as s:
                    text = "".join([piece async for piece in s.text_stream])
                    final = await s.get_final_message()
                assert text and final.usage.output_tokens == 7 and final.stop_reason

                counted = await client.messages.count_tokens(model=MODEL, messages=HI)
                assert counted.input_tokens >= 1

                with pytest.raises(anthropic.NotFoundError):  # the router's 404, their class
                    await client.messages.create(model="missing", max_tokens=4, messages=HI)
                with pytest.raises(anthropic.BadRequestError) as bad:
                    await client.messages.create(model=MODEL, max_tokens=4, messages=[])
                assert bad.value.body["error"]["type"] == "invalid_request_error"
            finally:
                await client.close()


async def test_anthropic_client_with_a_key_in_x_api_key(tmp_path) -> None:
    from gpuroute.auth import key_digest

    keys = (
        f'[auth]\nrequired = true\n[[auth.keys]]\nsha256 = "{key_digest("sk-a")}"\ntenant = "a"\n'
    )
    with fake_engines(("H100", 1.0)) as engines:
        config = router_toml([(e.url, e.gpu) for e in engines]) + keys
        async with running_router(config, tmp_path) as (url, _):
            good = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
            bad = anthropic.AsyncAnthropic(base_url=url, api_key="sk-wrong", max_retries=0)
            try:
                reply = await good.messages.create(model=MODEL, max_tokens=3, messages=HI)
                assert reply.usage.output_tokens == 3
                with pytest.raises(anthropic.AuthenticationError):
                    await bad.messages.create(model=MODEL, max_tokens=3, messages=HI)
            finally:
                await good.close()
                await bad.close()
