"""Every API the fake engine serves beyond chat, completions and embeddings, as vLLM 0.32
serves them (the contract test in tests/real_engine holds each to a real vLLM where the
testbed's tiny model lets one serve it):

| route | module | vLLM's own |
|---|---|---|
| /v1/responses, GET /v1/responses/{id}, POST .../cancel | fake_responses | openai/responses/ |
| /v1/messages, /v1/messages/count_tokens | fake_messages | anthropic/ |
| /rerank, /v1/rerank, /v2/rerank, /score, /v1/score | fake_pooling | pooling/scoring/ |
| /pooling, /classify | fake_pooling | pooling/pooling/, pooling/classify/ |
| /v1/audio/transcriptions, /v1/audio/translations | fake_audio | speech_to_text/ |
| /tokenize, /detokenize | fake_tokenize | serve/tokenize/ |

One fake engine serves them all, whatever its model; a real vLLM serves the pooling routes
only for a pooling model and audio only for a speech model."""

from __future__ import annotations

from aiohttp import web
from gpuroute.testbed.fake_engine.audio import FakeAudio
from gpuroute.testbed.fake_engine.common import ServingEngine
from gpuroute.testbed.fake_engine.messages import FakeMessages
from gpuroute.testbed.fake_engine.pooling import FakePooling
from gpuroute.testbed.fake_engine.responses import FakeResponses
from gpuroute.testbed.fake_engine.tokenize import FakeTokenize


def api_routes(engine: ServingEngine) -> list[web.RouteDef]:
    """The routes, each API's state (the Responses store) held by its handler object."""
    apis = (FakeResponses, FakeMessages, FakePooling, FakeAudio, FakeTokenize)
    return [route for api in apis for route in api(engine).routes()]
