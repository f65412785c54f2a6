"""The fake engine's Responses API, as vLLM 0.32 serves it (entrypoints/openai/responses/:
api_router.py, serving.py, streaming_events.py, protocol.py):

- `POST /v1/responses`: `input` (a string, or items: messages whose content is a string or
  input_text/output_text/input_image parts, and other items counted by their JSON),
  `instructions`, `max_output_tokens`, `stream`, `store`, `previous_response_id`,
  `background`. Paced by the engine model as a chat request is; a stream sends vLLM's
  events (response.created ... response.completed), each with `event:` and `data:` lines.
- `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`.

State, as in vLLM: stored responses live in this process's memory and die with it. vLLM
stores nothing unless started with VLLM_ENABLE_RESPONSES_API_STORE=1 (`store` is then
honoured; otherwise silently ignored, and `previous_response_id` or a GET finds nothing:
404); the fake reads the same variable. Unlike vLLM it keeps at most STORE_LIMIT responses
(the oldest go first) and does not stream background responses (400)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
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
    read_body,
)

from gpuroute.openai_api import error_response
from gpuroute.prompt import prefix_blocks, prompt_text, prompt_tokens

if TYPE_CHECKING:
    from gpuroute.testbed.live_engine import LiveRequest

STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
STORE_LIMIT = 10_000


@dataclass
class Turn:
    """One /v1/responses request as the engine sees it."""

    body: dict[str, Any]
    text: str  # what it prefills: instructions, the conversation it continues, its input
    prompt: int  # that, in tokens
    conversation: str  # the conversation so far without instructions (for the next turn)
    cap: int | None


@dataclass
class Stored:
    response: dict[str, Any]
    conversation: str  # input and output text, for a turn that continues it
    tokens: int  # input and output tokens


def input_messages(value: object) -> list[dict[str, Any]] | None:
    """`input` as chat messages (gpuroute.prompt counts them); None when malformed."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        return None
    messages = []
    for item in value:
        if not isinstance(item, dict):
            return None
        if item.get("type", "message") == "message":
            content = item.get("content")
            parts_ok = isinstance(content, list) and all(isinstance(p, dict) for p in content)
            if not isinstance(item.get("role"), str) or not (isinstance(content, str) or parts_ok):
                return None
            messages.append({"role": item["role"], "content": content})
        else:  # function_call, function_call_output, reasoning...: the model reads their JSON
            messages.append({"role": "tool", "content": json.dumps(item)})
    return messages


def store_enabled() -> bool:
    try:
        return bool(int(os.environ.get(STORE_ENV, "0") or "0"))
    except ValueError:
        return False


class FakeResponses:
    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self.store_enabled = store_enabled()
        self.stored: OrderedDict[str, Stored] = OrderedDict()
        self.background: dict[str, asyncio.Task] = {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/responses", self.create),
            web.get("/v1/responses/{response_id}", self.retrieve),
            web.post("/v1/responses/{response_id}/cancel", self.cancel),
        ]

    # -- the request ------------------------------------------------------------------------
    def _turn(self, body: dict[str, Any]) -> Turn | web.Response:
        messages = input_messages(body.get("input"))
        if messages is None:
            return field_error("input", "a string or a list of input items")
        instructions, cap = body.get("instructions"), body.get("max_output_tokens")
        if instructions is not None and not isinstance(instructions, str):
            return field_error("instructions", "a string")
        if cap is not None and not is_int(cap):
            return field_error("max_output_tokens", "an integer")
        if too_big := cap_too_big(self.engine, "max_output_tokens", cap):
            return error_response(400, too_big, param="max_output_tokens")
        for flag in ("stream", "store", "background"):
            if not isinstance(body.get(flag, False), bool):
                return field_error(flag, "a boolean")
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            return field_error("previous_response_id", "a string")
        before = self.stored.get(previous) if previous is not None else None
        if previous is not None and before is None:
            return not_found(previous)
        chat = {"messages": messages}
        said, said_tokens = prompt_text(chat), prompt_tokens(chat)
        conversation = f"{before.conversation}\n{said}" if before else said
        prompt = said_tokens + (before.tokens if before else 0)
        text = conversation
        if instructions:
            text = f"{instructions}\n{conversation}"
            prompt += prompt_tokens({"messages": [{"role": "system", "content": instructions}]})
        return Turn(body, text, prompt, conversation, cap)

    def _refuse_long(self, turn: Turn) -> web.Response | None:
        longest = self.engine.max_model_len
        if turn.prompt < longest:
            return None
        message = (
            f"This model's maximum context length is {longest} tokens. However, your prompt "
            f"contains at least {turn.prompt} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt."
        )
        return error_response(400, message, param="input_tokens")

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(self.engine, request)
        if isinstance(body, web.Response):
            return body
        turn = self._turn(body)
        if isinstance(turn, web.Response):
            return turn
        if refused := self._refuse_long(turn):
            return refused
        if body.get("background"):
            if not self.store_enabled:
                return error_response(400, BACKGROUND_NEEDS_STORE, param="background")
            if body.get("stream"):
                return error_response(400, NO_BACKGROUND_STREAM, param="background")
        output, finish = answer_length(self.engine, request, turn.cap)
        live = self.engine.submit(turn.prompt, output, prefix_blocks(turn.text))
        if isinstance(live, web.StreamResponse):
            return live
        max_output = turn.cap or self.engine.max_model_len - turn.prompt
        base = payloads.response_object(
            body, hex_id("resp_"), int(time.time()), self.engine.name, max_output
        )
        run = Run(turn, live, output, finish, base)
        if body.get("background"):
            return self._start_background(run)
        if body.get("stream"):
            return await self._stream(request, run)
        await finish_all(self.engine, [live], finish)
        return web.json_response(self._finish(run, hex_id("msg_")))

    # -- answers ------------------------------------------------------------------------------
    def _finish(self, run: Run, item_id: str) -> dict[str, Any]:
        """The finished response, stored when asked to and allowed (not over a cancel)."""
        text = payloads.tokens_text(run.output)
        item = payloads.output_message(item_id, text)
        done = payloads.response_done(run.base, item, run.turn.prompt, run.output, run.finish)
        if self.store_enabled and run.turn.body.get("store", True):
            rid = done["id"]
            held = self.stored.get(rid)
            if held is None or held.response["status"] != "cancelled":
                conversation = f"{run.turn.conversation}\n{text}"
                self._keep(rid, Stored(done, conversation, run.turn.prompt + run.output))
        return done

    def _keep(self, rid: str, stored: Stored) -> None:
        self.stored[rid] = stored
        self.stored.move_to_end(rid)
        while len(self.stored) > STORE_LIMIT:
            self.stored.popitem(last=False)

    async def _stream(self, request: web.Request, run: Run) -> web.StreamResponse:
        engine, live = self.engine, run.live
        assert engine.engine is not None
        numbers = itertools.count()

        def event(kind: str, **fields: Any) -> bytes:
            return named_event(kind, fields | {"sequence_number": next(numbers), "type": kind})

        item_id = hex_id("msg_")
        where = {"content_index": 0, "item_id": item_id, "output_index": 0}
        try:
            response = await open_stream(request)
            await response.write(event("response.created", response=run.base))
            await response.write(event("response.in_progress", response=run.base))
            await live.first_token
            opened = payloads.output_message(item_id, None, "in_progress")
            await response.write(event("response.output_item.added", item=opened, output_index=0))
            part = payloads.output_text_part("", [])
            await response.write(event("response.content_part.added", part=part, **where))

            def delta(n: int) -> bytes:
                text = payloads.tokens_text(n)
                return event("response.output_text.delta", delta=text, logprobs=[], **where)

            await engine.stream_tokens(response, delta, live, run.output)
            await engine.faults.resumed.wait()
            done = self._finish(run, item_id)
            await self._stream_end(response, event, done, where)
            engine.finished[run.finish] += 1
        except (ConnectionError, asyncio.CancelledError):
            hung_up(engine, [live], run.finish)  # the client went away
            raise
        return response

    @staticmethod
    async def _stream_end(response, event, done: dict[str, Any], where: dict[str, Any]) -> None:
        item = done["output"][0]
        text = item["content"][0]["text"]
        await response.write(event("response.output_text.done", logprobs=[], text=text, **where))
        part = payloads.output_text_part(text)
        await response.write(event("response.content_part.done", part=part, **where))
        await response.write(event("response.output_item.done", item=item, output_index=0))
        await response.write(event("response.completed", response=done))
        await response.write_eof()

    # -- background mode, retrieval and cancel ------------------------------------------------
    def _start_background(self, run: Run) -> web.Response:
        queued = run.base | {"status": "queued"}
        rid = queued["id"]
        self._keep(rid, Stored(queued, run.turn.conversation, run.turn.prompt))

        async def finish() -> None:
            await finish_all(self.engine, [run.live], run.finish)
            self._finish(run, hex_id("msg_"))

        task = asyncio.get_running_loop().create_task(finish(), name=f"create_{rid}")
        self.background[rid] = task
        task.add_done_callback(lambda _: self.background.pop(rid, None))
        return web.json_response(queued)

    async def retrieve(self, request: web.Request) -> web.Response:
        await self.engine.faults.resumed.wait()
        rid = request.match_info["response_id"]
        stored = self.stored.get(rid)
        if stored is None:
            return not_found(rid)
        if request.query.get("stream", "false").lower() == "true":
            return error_response(400, NO_BACKGROUND_STREAM, param="stream")
        return web.json_response(stored.response)

    async def cancel(self, request: web.Request) -> web.Response:
        await self.engine.faults.resumed.wait()
        rid = request.match_info["response_id"]
        stored = self.stored.get(rid)
        if stored is None:
            return not_found(rid)
        if stored.response["status"] not in ("queued", "in_progress"):
            return error_response(400, "Cannot cancel a synchronous response.", param="response_id")
        stored.response["status"] = "cancelled"
        if task := self.background.get(rid):
            task.cancel()  # finish_all aborts its engine request
            await asyncio.gather(task, return_exceptions=True)
        return web.json_response(stored.response)


@dataclass
class Run:
    """A response being generated: its turn, engine request, length and base object."""

    turn: Turn
    live: LiveRequest
    output: int
    finish: str
    base: dict[str, Any]


def not_found(rid: str) -> web.Response:
    return error_response(404, f"Response with id '{rid}' not found.", param="response_id")


BACKGROUND_NEEDS_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the "
    "background mode. To enable these features, set the environment variable "
    "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)
NO_BACKGROUND_STREAM = "the fake engine does not stream background responses"
