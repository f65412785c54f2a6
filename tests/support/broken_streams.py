"""Scripted upstreams whose streams die mid-answer (an engine behind a router, or a region's
router behind the global tier: both speak OpenAI's SSE), and reading back what a client
received."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web

from support.live import MODEL

# a client's call: a stream that should have gone on but hangs fails in seconds, naming it
BOUNDED = aiohttp.ClientTimeout(total=20)
BEFORE = [" a1", " a2", " a3"]  # what the first engine streams before it dies
AFTER = [" b1", " b2"]
PROMPT_TOKENS = 7


def chunk(rid: str, created: int, delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    event = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": MODEL,
             "choices": [choice]}  # fmt: skip
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def text_chunk(rid: str, created: int, text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    event = {"id": rid, "object": "text_completion", "created": created, "model": MODEL,
             "choices": [choice]}  # fmt: skip
    return b"data: " + json.dumps(event).encode() + b"\n\n"


VLLM_ERROR_EVENT = (b'data: {"error": {"object": "error", "message": "EngineCore '
                    b'encountered an issue", "type": "InternalServerError", "param": null, '
                    b'"code": 500}}\n\n')  # fmt: skip


class DyingThenHealthy:
    """Every backend runs this: a first request streams BEFORE and dies; a continuation
    (it says so: the assistant's turn continued, or the text appended to the prompt)
    streams AFTER, its finish and, when asked, usage as vLLM reports it (its prompt holds
    the text before)."""

    def __init__(self, *, error_event: bool = False) -> None:
        # True: the first stream ends with vLLM's error event and [DONE] (its engine core
        # failed, its API server lives on) instead of its connection dying
        self.error_event = error_event
        self.bodies: list[dict] = []
        self.headers: list[dict[str, str]] = []  # each request's, in order

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        chat = "messages" in body
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        continuing = body.get("continue_final_message") or "".join(BEFORE) in str(
            body.get("prompt")
        )
        rid, created = ("cmpl-b", 222) if continuing else ("cmpl-a", 111)
        if chat:
            await response.write(chunk(rid, created, {"role": "assistant", "content": ""}))
        for piece in AFTER if continuing else BEFORE:
            out = (
                chunk(rid, created, {"content": piece}) if chat else text_chunk(rid, created, piece)
            )
            await response.write(out)
        if not continuing and self.error_event:
            await response.write(VLLM_ERROR_EVENT + b"data: [DONE]\n\n")
            return response
        if not continuing:
            request.transport.abort()  # the engine dies with the answer half sent
            return response
        end = chunk(rid, created, {}, "stop") if chat else text_chunk(rid, created, "", "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt = PROMPT_TOKENS + len(BEFORE)
            usage = {"prompt_tokens": prompt, "completion_tokens": len(AFTER),
                     "total_tokens": prompt + len(AFTER)}  # fmt: skip
            end += b"data: " + json.dumps({"id": rid, "choices": [], "usage": usage}).encode()
            end += b"\n\n"
        await response.write(end + b"data: [DONE]\n\n")
        return response


def events(raw: bytes) -> list[dict]:
    out = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(json.loads(event.removeprefix(b"data: ")))
    return out


class RefusesTheContinuation(DyingThenHealthy):
    """As vLLM when the prompt plus the text so far no longer fits its context: a 400."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if body.get("continue_final_message"):
            self.bodies.append(body)
            error = {"message": "too long", "type": "BadRequestError", "code": 400}
            return web.json_response({"error": error}, status=400)
        return await super().__call__(request)


def chat_text(raw: bytes) -> str:
    """A chat stream's text as a client reads it."""
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in events(raw)
                   if c["choices"])  # fmt: skip


def assert_one_answer(raw: bytes, engine: DyingThenHealthy, max_tokens: int) -> None:
    """`raw` (a chat stream with usage asked for, whose first upstream died after BEFORE)
    reads as one answer: one id and created, one role chunk, BEFORE then AFTER, one finish,
    usage for all of it; the continuation (the second body `engine` got) continued the
    assistant's turn with `max_tokens` less what was sent."""
    assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
    chunks = events(raw)
    assert {(c["id"], c["created"]) for c in chunks} == {("cmpl-a", 111)}  # one stream
    assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1
    assert chat_text(raw) == "".join(BEFORE + AFTER)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["stop"]
    assert chunks[-1]["usage"] == {"prompt_tokens": PROMPT_TOKENS, "total_tokens": 12,
                                   "completion_tokens": len(BEFORE) + len(AFTER)}  # fmt: skip
    first, second = engine.bodies
    assert second["messages"] == [*first["messages"],
                                  {"role": "assistant", "content": "".join(BEFORE)}]  # fmt: skip
    assert (second["continue_final_message"], second["add_generation_prompt"]) == (True, False)
    assert second["max_tokens"] == max_tokens - len(BEFORE)
