"""The fake engine's Anthropic Messages API, as vLLM 0.32 serves it (entrypoints/anthropic/:
api_router.py, serving.py, protocol.py): `POST /v1/messages` (`model`, `max_tokens` and
`messages` required; `system`, `stream`) run as the chat request vLLM converts it to, and
`POST /v1/messages/count_tokens`.

Errors come in two shapes, as in vLLM: a body its pydantic model refuses (not JSON, a
required field missing or of the wrong type) gets OpenAI's `{"error": {...}}` (vLLM's
validation handler serves every route), while what the handler refuses (an unknown model,
`max_tokens` beyond the context) gets Anthropic's `{"type": "error", "error": {"type",
"message"}}` (api_router.translate_error_response). vLLM puts its own exception names in
`error.type` ("NotFoundError"); the fake uses Anthropic's ("not_found_error").

A stream sends vLLM's events: message_start, content_block_start, content_block_delta
(text_delta) as tokens come, content_block_stop, message_delta (stop_reason, usage),
message_stop, each with `event:` and `data:` lines; no ping."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web
from gpuroute.testbed.fake_engine import payloads
from gpuroute.testbed.fake_engine.common import (
    ServingEngine,
    answer_length,
    cap_too_big,
    field_error,
    finish_all,
    hex_id,
    hung_up,
    is_int,
    named_event,
    open_stream,
)

from gpuroute.anthropic_errors import anthropic_error_body
from gpuroute.prompt import prefix_blocks, prompt_text, prompt_tokens

if TYPE_CHECKING:
    from gpuroute.testbed.live_engine import LiveRequest

ROLES = ("user", "assistant", "system")


def anthropic_error(status: int, message: str) -> web.Response:
    return web.json_response(anthropic_error_body(status, message), status=status)


def _block(block: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic content block as a chat part gpuroute.prompt counts."""
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if block.get("type") in ("image", "document"):
        return {"type": "image"}
    return {"type": "text", "text": json.dumps(block)}  # tool_use, tool_result, thinking...


def _content(content: object) -> str | list[dict[str, Any]] | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) for b in content):
        return [_block(b) for b in content]
    return None


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]] | web.Response:
    """`system` and `messages` as the chat messages vLLM converts them to."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        content = _content(system)
        if content is None:
            return field_error("system", "a string or a list of content blocks")
        messages.append({"role": "system", "content": content})
    given = body.get("messages")
    if not isinstance(given, list):
        return field_error("messages", "a list of messages")
    for message in given:
        content = _content(message.get("content")) if isinstance(message, dict) else None
        if content is None or message.get("role") not in ROLES:
            return field_error("messages", "a list of {role, content} messages")
        messages.append({"role": message["role"], "content": content})
    return messages


class FakeMessages:
    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.create),
            web.post("/v1/messages/count_tokens", self.count_tokens),
        ]

    async def _read(
        self, request: web.Request, *, create: bool = False
    ) -> tuple[dict, dict] | web.Response:
        """(body, its chat body), or the error vLLM answers: the body's schema first (a
        create needs an integer `max_tokens`), then the model."""
        body = await self.engine.admit(request, check_model=False)
        if isinstance(body, web.StreamResponse):
            return body  # type: ignore[return-value]
        model = body.get("model")
        if not isinstance(model, str):
            return field_error("model", "a string")
        messages = chat_messages(body)
        if isinstance(messages, web.Response):
            return messages
        if create and not is_int(body.get("max_tokens")):
            return field_error("max_tokens", "an integer")
        if create and not isinstance(body.get("stream", False), bool):
            return field_error("stream", "a boolean")
        if model != self.engine.name:
            return anthropic_error(404, f"The model `{model}` does not exist.")
        chat: dict[str, Any] = {"messages": messages}
        if isinstance(body.get("tools"), list) and body["tools"]:
            chat["tools"] = body["tools"]
        return body, chat

    async def count_tokens(self, request: web.Request) -> web.Response:
        read = await self._read(request)
        if isinstance(read, web.Response):
            return read
        tokens = prompt_tokens(read[1])
        return web.json_response(
            {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}
        )

    async def create(self, request: web.Request) -> web.StreamResponse:
        read = await self._read(request, create=True)
        if isinstance(read, web.Response):
            return read
        body, chat = read
        cap = body["max_tokens"]
        if too_big := cap_too_big(self.engine, "max_completion_tokens", cap):
            return anthropic_error(400, too_big)
        prompt = prompt_tokens(chat)
        output, finish = answer_length(self.engine, request, cap)
        assert self.engine.engine is not None
        try:
            live = self.engine.engine.submit(prompt, output, prefix_blocks(prompt_text(chat)))
        except ValueError as exc:  # it can never fit in the KV cache
            return anthropic_error(400, str(exc))
        rid = hex_id("chatcmpl-")
        if body.get("stream"):
            return await self._stream(request, live, rid, prompt, output, finish)
        await finish_all(self.engine, [live], finish)
        text = payloads.tokens_text(output)
        return web.json_response(
            payloads.anthropic_message(rid, self.engine.name, text, prompt, output, finish)
        )

    async def _stream(
        self, request: web.Request, live: LiveRequest, rid: str, prompt: int, output: int,
        finish: str,
    ) -> web.StreamResponse:  # fmt: skip
        engine = self.engine
        assert engine.engine is not None
        start = {"id": rid, "type": "message", "role": "assistant", "content": [],
                 "model": engine.name, "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": prompt, "output_tokens": 0}}  # fmt: skip

        def event(kind: str, **fields: Any) -> bytes:
            return named_event(kind, {"type": kind} | fields)

        def delta(n: int) -> bytes:
            text = {"type": "text_delta", "text": payloads.tokens_text(n)}
            return event("content_block_delta", delta=text, index=0)

        try:
            await live.first_token
            response = await open_stream(request)
            await response.write(event("message_start", message=start))
            block = {"type": "text", "text": ""}
            await response.write(event("content_block_start", content_block=block, index=0))
            await engine.stream_tokens(response, delta, live, output)
            await engine.faults.resumed.wait()
            await response.write(event("content_block_stop", index=0))
            stop = {"stop_reason": payloads.anthropic_stop_reason(finish), "stop_sequence": None}
            usage = {"input_tokens": prompt, "output_tokens": output}
            await response.write(event("message_delta", delta=stop, usage=usage))
            await response.write(event("message_stop"))
            await response.write_eof()
            engine.finished[finish] += 1
        except (ConnectionError, asyncio.CancelledError):
            hung_up(engine, [live], finish)  # the client went away
            raise
        return response
