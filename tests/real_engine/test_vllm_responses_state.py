"""The router's Responses API state in front of a real vLLM (which stores nothing: it is
started without VLLM_ENABLE_RESPONSES_API_STORE): the official `openai` client across three
turns, streamed and not, each follow-up prefilled with the whole conversation (vLLM's own
usage says so), and the stored responses read back by id."""

from __future__ import annotations

import openai
import pytest
from support.live import router_toml, running_router
from support.real_engine import SERVED

pytestmark = [pytest.mark.asyncio, pytest.mark.real_engine]
FIXED_LENGTH = {"ignore_eos": True}  # random weights may emit </s> early; count exactly


async def test_three_turns_carried_by_the_routers_state(vllm, tmp_path) -> None:
    config = router_toml([(vllm.url, "L4")], model=SERVED)
    async with running_router(config, tmp_path) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        try:
            first = await client.responses.create(
                model=SERVED, input="hello", max_output_tokens=6, extra_body=FIXED_LENGTH
            )
            assert first.status in ("completed", "incomplete") and first.usage.output_tokens == 6
            stream = await client.responses.create(
                model=SERVED, input=[{"role": "user", "content": "and again"}],
                previous_response_id=first.id, max_output_tokens=5, stream=True,
                extra_body=FIXED_LENGTH,
            )  # fmt: skip
            second = None
            async for event in stream:
                if event.type in ("response.completed", "response.incomplete"):
                    second = event.response
            assert second is not None and second.usage.output_tokens == 5
            # the first turn's input and its 6 output tokens were prefilled again
            seen = first.usage.input_tokens + first.usage.output_tokens
            assert second.usage.input_tokens > seen
            third = await client.responses.create(
                model=SERVED, input="once more", previous_response_id=second.id,
                max_output_tokens=4, extra_body=FIXED_LENGTH,
            )  # fmt: skip
            assert third.usage.input_tokens > second.usage.input_tokens + 5

            fetched = await client.responses.retrieve(second.id)
            assert fetched.id == second.id and fetched.previous_response_id == first.id
            with pytest.raises(openai.BadRequestError):
                await client.responses.cancel(second.id)
        finally:
            await client.close()
