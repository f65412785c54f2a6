"""What the fake engine's API modules share (responses.py, messages.py, pooling.py,
tokenize.py and audio.py beside it): reading a JSON body and its model as vLLM
does, sizing an answer, running prefill-only work in the engine model, and SSE framing.

vLLM checks a body against its pydantic model before any handler runs, so a body that is
not JSON, or lacks a required field, gets OpenAI's error shape on every route (Anthropic's
/v1/messages included); errors its handlers raise come in the route's own format."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from gpuroute.openai_api import error_response

if TYPE_CHECKING:
    import random

    from gpuroute.testbed.fake_engine.config import FakeEngineConfig
    from gpuroute.testbed.faults import Faults
    from gpuroute.testbed.live_engine import LiveEngine, LiveRequest

OUTPUT_HEADER = "x-fake-output-tokens"  # replay's true output length; routers never read it


class ServingEngine(Protocol):
    """What the API modules use of the engine that serves them (server.py's FakeEngine):
    its name, config and context, the engine model, faults and counters, and its steps of
    admitting a request, submitting it to the engine model and streaming its tokens."""

    config: FakeEngineConfig
    name: str
    max_model_len: int
    rng: random.Random
    faults: Faults
    engine: LiveEngine | None
    errors_injected: int
    finished: dict[str, int]  # by vLLM's finished_reason

    async def admit(
        self, request: web.Request, *, check_model: bool = True
    ) -> dict[str, Any] | web.StreamResponse: ...

    def submit(self, prompt: int, output: int, blocks) -> LiveRequest | web.StreamResponse: ...

    async def stream_tokens(self, response, chunk, live: LiveRequest, output: int) -> None: ...


def hex_id(prefix: str) -> str:
    """An id as vLLM spells it: a prefix and 16 hex digits (vllm.utils.random_uuid)."""
    return f"{prefix}{uuid.uuid4().hex[:16]}"


def named_event(event: str, payload: dict[str, Any]) -> bytes:
    """One SSE event with an `event:` line, as the Responses and Messages APIs send them."""
    return f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode()


def unknown_model(model: object) -> web.Response:
    """vLLM's 404 for a model it does not serve (serve/engine/serving.py, _check_model)."""
    return error_response(
        404, f"The model `{model}` does not exist.", code="model_not_found", param="model"
    )


async def read_body(engine: ServingEngine, request: web.Request) -> dict[str, Any] | web.Response:
    """The JSON body, or the error vLLM answers: a fault's, a body that is not a JSON
    object (400), an unknown model (404). `model` is optional, as vLLM's request models
    make it for Responses, tokenize and pooling (its default model serves)."""
    body = await engine.admit(request, check_model=False)
    if isinstance(body, web.StreamResponse):
        return body
    model = body.get("model")
    if model is not None and model != engine.name:
        return unknown_model(model)
    return body


def field_error(name: str, expected: str) -> web.Response:
    """A body field of the wrong type or missing (vLLM: a pydantic validation error)."""
    return error_response(400, f"'{name}' must be {expected}", param=name)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def answer_length(engine: ServingEngine, request: web.Request, cap: int | None) -> tuple[int, str]:
    """How many tokens to generate and why it stops: the replayed length (OUTPUT_HEADER)
    or the engine's default, cut to the client's cap ("length")."""
    wanted = request.headers.get(OUTPUT_HEADER)
    output = int(wanted) if wanted and wanted.isdigit() else engine.config.default_output_tokens
    if cap is not None and 0 < cap <= output:
        return cap, "length"
    return max(1, output), "stop"


def cap_too_big(engine: ServingEngine, name: str, cap: object) -> str | None:
    """vLLM's refusal of an output cap beyond the context (400), or None."""
    if is_int(cap) and cap > engine.max_model_len:
        return (
            f"{name}={cap} cannot be greater than max_model_len={engine.max_model_len}. "
            "Please request fewer output tokens."
        )
    return None


def submit_all(
    engine: ServingEngine, jobs: Sequence[tuple[int, int, tuple[int, ...]]]
) -> list[LiveRequest] | web.Response:
    """Queue (prompt, output, prefix blocks) requests in the engine model, all or none:
    a batch with one request too big for the KV cache is refused (400) before any runs."""
    assert engine.engine is not None
    lives: list[LiveRequest] = []
    for prompt, output, blocks in jobs:
        live = engine.submit(prompt, output, blocks)
        if isinstance(live, web.StreamResponse):
            for queued in lives:
                engine.engine.cancel(queued)
            return live  # type: ignore[return-value]
        lives.append(live)
    return lives


async def finish_all(
    engine: ServingEngine, lives: Sequence[LiveRequest], reason: str | Sequence[str]
) -> None:
    """Wait until every request is done (and no hang fault holds the answer), counting
    each in vLLM's request_success by its reason (one for all, or one each); a client
    that hangs up aborts those still running."""
    reasons = [reason] * len(lives) if isinstance(reason, str) else list(reason)
    try:
        if lives:
            await asyncio.wait([live.done for live in lives])
    except asyncio.CancelledError:
        hung_up(engine, lives, reasons)
        raise
    for why in reasons:
        engine.finished[why] += 1
    await engine.faults.resumed.wait()


def hung_up(
    engine: ServingEngine, lives: Sequence[LiveRequest], reason: str | Sequence[str]
) -> None:
    """The client went away: a request the engine model finished counts by its reason; one
    still running is aborted there (its slot and KV cache freed) and counts as "abort"."""
    assert engine.engine is not None
    reasons = [reason] * len(lives) if isinstance(reason, str) else list(reason)
    for live, why in zip(lives, reasons, strict=True):
        if live.done.done():
            if not live.done.cancelled():
                engine.finished[why] += 1
            continue
        engine.engine.cancel(live)
        live.done.cancel()  # marks it ended: nothing counts it twice
        engine.finished["abort"] += 1


async def prefill_only(
    engine: ServingEngine, prompts: Sequence[tuple[int, tuple[int, ...]]]
) -> web.Response | None:
    """Run pooling work (rerank, score, pooling, classify): one engine request per
    sequence, each a prefill and nothing after it, as vLLM runs each pair or input as its
    own request. Their prompt tokens count in vllm:prompt_tokens and none as generated."""
    lives = submit_all(engine, [(tokens, 1, blocks) for tokens, blocks in prompts])
    if isinstance(lives, web.Response):
        return lives
    await finish_all(engine, lives, "stop")
    assert engine.engine is not None
    # the engine model emits the first token at the end of a prefill; a pooling request
    # has no output, so vLLM counts none (LiveEngine counted one per request)
    engine.engine.generation_tokens_total -= len(lives)
    return None


def pooling_usage(prompt: int) -> dict[str, Any]:
    """vLLM's UsageInfo as pooling and scoring answers dump it (serve/engine/protocol.py)."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    return response


def continuing(body: dict) -> web.Response | None:
    """vLLM's 400s for a continued assistant turn: with `continue_final_message`, the
    generation prompt must be turned off (its default, true, is refused too)."""
    if body.get("continue_final_message") and body.get("add_generation_prompt", True):
        return error_response(
            400,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )
    return None


def refused_body(body: dict, kind: str) -> web.Response | None:
    """A generation body vLLM refuses (400) before it looks at the prompt's length."""
    if kind == "chat" and not isinstance(body.get("messages"), list):
        return error_response(400, "'messages' must be a list", param="messages")
    if kind == "completion" and not isinstance(body.get("prompt"), str | list):
        return error_response(400, "'prompt' must be a string or list", param="prompt")
    if body.get("stream") and body.get("prompt_logprobs") not in (None, 0):
        message = "`prompt_logprobs` are not available when `stream=True`."
        return error_response(400, message, param="prompt_logprobs")
    return None
