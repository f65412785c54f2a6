"""The official `openai` package works unchanged against the router."""

from __future__ import annotations

import openai
import pytest
from support.live import MODEL, fake_engines, router_toml, running_router

pytestmark = pytest.mark.asyncio


async def test_openai_client_streaming_and_not(tmp_path) -> None:
    with fake_engines(("H100", 1.0), ("A100", 1.0)) as engines:
        config = router_toml([(e.url, e.gpu) for e in engines])
        async with running_router(config, tmp_path) as (url, _):
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            try:
                models = await client.models.list()
                assert [m.id for m in models.data] == [MODEL]

                reply = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6
                )
                assert reply.choices[0].message.content == " tok" * 6
                assert reply.usage.completion_tokens == 6

                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=7,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                pieces, usage = [], None
                async for chunk in stream:
                    if chunk.choices:
                        pieces.append(chunk.choices[0].delta.content or "")
                    usage = chunk.usage or usage
                assert "".join(pieces) == " tok" * 7 and usage.completion_tokens == 7

                text = await client.completions.create(model=MODEL, prompt="abc", max_tokens=3)
                assert text.choices[0].text == " tok" * 3

                vectors = await client.embeddings.create(model=MODEL, input=["a", "b"])
                assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 16

                with pytest.raises(openai.NotFoundError):
                    await client.chat.completions.create(
                        model="missing", messages=[{"role": "user", "content": "x"}]
                    )
                with pytest.raises(openai.BadRequestError):
                    await client.chat.completions.create(model=MODEL, messages=[])
            finally:
                await client.close()
