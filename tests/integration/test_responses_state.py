"""The Responses API's state kept by the router, against fake engines (which, as vLLM by
default, store nothing): the official `openai` client across turns, a follow-up surviving
the engine that served the first turn, and stored responses by id."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest
from support.live import MODEL, fake_engines, router_toml, running_router

pytestmark = pytest.mark.asyncio
BACKEND = "x-gpuroute-backend"


async def test_openai_client_responses_across_turns_streaming_and_not(tmp_path) -> None:
    with fake_engines(("H100", 1.0), ("A100", 1.0)) as engines:
        config = router_toml([(e.url, e.gpu) for e in engines])
        async with running_router(config, tmp_path) as (url, _):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            try:
                first = await client.responses.create(
                    model=MODEL, input="hello there", instructions="be brief",
                    max_output_tokens=6,
                )  # fmt: skip
                assert first.status in ("completed", "incomplete")  # the cap cut it: incomplete
                assert first.id.startswith("resp_")
                assert first.output_text == " tok" * 6

                stream = await client.responses.create(
                    model=MODEL, input=[{"role": "user", "content": "and then?"}],
                    previous_response_id=first.id, max_output_tokens=5, stream=True,
                )  # fmt: skip
                kinds, second = [], None
                async for event in stream:
                    kinds.append(event.type)
                    if event.type == "response.completed":
                        second = event.response
                assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
                assert second is not None and second.output_text == " tok" * 5
                # the engine prefilled the whole conversation: both turns' input and output
                assert second.usage.input_tokens > first.usage.input_tokens + 6

                third = await client.responses.create(
                    model=MODEL, input="last one", previous_response_id=second.id,
                    max_output_tokens=3,
                )  # fmt: skip
                assert third.usage.input_tokens > second.usage.input_tokens + 5

                got = await client.responses.retrieve(second.id)
                assert got.id == second.id and got.output_text == " tok" * 5
                assert got.previous_response_id == first.id  # as the client sent it
                with pytest.raises(openai.BadRequestError, match="synchronous"):
                    await client.responses.cancel(second.id)
                await client.responses.delete(second.id)
                with pytest.raises(openai.NotFoundError):
                    await client.responses.retrieve(second.id)
                with pytest.raises(openai.NotFoundError):
                    await client.responses.create(
                        model=MODEL, input="x", previous_response_id=second.id
                    )
                with pytest.raises(openai.BadRequestError, match="background"):
                    await client.responses.create(model=MODEL, input="x", background=True)
                unstored = await client.responses.create(
                    model=MODEL, input="x", store=False, max_output_tokens=2
                )
                with pytest.raises(openai.NotFoundError):
                    await client.responses.retrieve(unstored.id)
            finally:
                await client.close()


async def test_a_follow_up_turn_survives_the_engine_that_served_the_first(tmp_path) -> None:
    """Two engines; the first turn is served by one, which is then killed: the follow-up
    with previous_response_id is served by the other, with the whole conversation."""
    with fake_engines(("H100", 1.0), ("H100", 1.0)) as engines:
        by_id = {f"127.0.0.1:{e.port}": e for e in engines}
        config = router_toml([(e.url, e.gpu) for e in engines])  # names the backend
        async with running_router(config, tmp_path) as (url, _):
            post = url + "/v1/responses"
            async with aiohttp.ClientSession() as s:
                body = {"model": MODEL, "input": "remember the number 42", "max_output_tokens": 4}
                async with s.post(post, json=body) as r:
                    assert r.status == 200, await r.text()
                    first, served = await r.json(), r.headers[BACKEND]
                by_id[served].kill()  # the engine and everything it held are gone
                follow = {"model": MODEL, "input": "which number?", "max_output_tokens": 4,
                          "previous_response_id": first["id"], "stream": True}  # fmt: skip
                async with s.post(post, json=follow) as r:
                    assert r.status == 200, await r.text()
                    text = await r.text()
                    assert r.headers[BACKEND] != served
                [done] = [e for e in text.split("\n\n") if "event: response.completed" in e]
                second_id = json.loads(done.split("data: ", 1)[1])["response"]["id"]
                async with s.get(f"{post}/{second_id}") as r:
                    stored = await r.json()
                    assert r.status == 200 and stored["previous_response_id"] == first["id"]
                assert stored["usage"]["input_tokens"] > first["usage"]["input_tokens"] + 4
