"""Bodies of the two stateful or foreign formats the router serves: OpenAI's Responses API
and Anthropic's Messages API, summarised for the scheduler (router/api/bodies.py reads the
OpenAI completions family)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from gpuroute.router.api.bodies import (
    BodyError,
    BodySummary,
    positive_int,
    required_input,
    stream_flag,
)

from gpuroute.anthropic_errors import ANTHROPIC_ROUTES, anthropic_stream_error
from gpuroute.prompt import estimate_tokens

# Responses API tools run by the server itself (OpenAI's hosted tools): an engine behind a
# router has none of them
BUILT_IN_TOOLS = frozenset(
    {"web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use",
     "computer_use_preview", "image_generation", "mcp", "local_shell"}
)  # fmt: skip


def _content_text(content: Any) -> str:
    """A message's content: a string, or parts whose `text` is kept."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def items_text(items: Any) -> str:
    """The text of a Responses `input` (a string or a list of items) or of Anthropic
    `messages`, joined in order."""
    if isinstance(items, str):
        return items
    if not isinstance(items, list):
        return ""
    parts = []
    for item in items:
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, dict):
            text = _content_text(item.get("content"))
            if not text and isinstance(item.get("output"), str):  # a tool call's output
                text = item["output"]
            if not text and isinstance(item.get("arguments"), str):  # a function call
                text = item["arguments"]
            parts.append(text)
    return "\n".join(p for p in parts if p)


def read_responses(body: dict[str, Any]) -> BodySummary:
    """POST /v1/responses: `input` (a string or items), optional `instructions`,
    `max_output_tokens`. Background mode and built-in tools are refused: nothing here can
    run them."""
    required_input(body, "input")
    value = body["input"]
    if body.get("background") is True:
        raise BodyError("background mode is not supported by gpuroute; stream instead",
                        "background")  # fmt: skip
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BodyError("'tools' must be a list", "tools")
    for tool in tools or ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in BUILT_IN_TOOLS:
            raise BodyError(f"built-in tool {kind!r} is not supported: engines run function "
                            "tools only", "tools")  # fmt: skip
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BodyError("'instructions' must be a string", "instructions")
    text = "\n".join(t for t in (instructions, items_text(value)) if t)
    max_tokens = positive_int(body, "max_output_tokens")
    return BodySummary(text, max(1, estimate_tokens(text)), max_tokens, stream_flag(body))


def _anthropic_prompt(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BodyError("messages: field required (a non-empty list)", "messages")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BodyError("messages: each must be an object with role user or assistant",
                            "messages")  # fmt: skip
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise BodyError("system: must be a string or a list of text blocks", "system")
    return "\n".join(t for t in (_content_text(system), items_text(messages)) if t)


def read_messages(body: dict[str, Any]) -> BodySummary:
    """POST /v1/messages (Anthropic): `max_tokens` is required there."""
    text = _anthropic_prompt(body)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BodyError("max_tokens: field required (a positive integer)", "max_tokens")
    return BodySummary(text, max(1, estimate_tokens(text)), max_tokens, stream_flag(body))


def read_count_tokens(body: dict[str, Any]) -> BodySummary:
    text = _anthropic_prompt(body)
    return BodySummary("", max(1, estimate_tokens(text)), 0, False, 0)


def responses_stream_error(message: str) -> bytes:
    """A broken Responses stream's last event, as the Responses API streams errors."""
    body = {"type": "error", "code": "upstream_stream_error", "message": message, "param": None}
    return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"


def stream_error_event(route: str) -> Callable[[str], bytes] | None:
    """The last event of a stream on `route` that broke after its first bytes, in that API's
    own format (None: OpenAI's chat and completions error event, then [DONE])."""
    if route in ANTHROPIC_ROUTES:
        return anthropic_stream_error
    if route == "/v1/responses":
        return responses_stream_error
    return None
