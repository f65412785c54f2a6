"""Parse an OpenAI request body once: validate it and extract what the scheduler needs.

The body is forwarded unchanged (the raw bytes); only this summary is kept."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from gpuroute.router.core.request import RequestInfo

from gpuroute.auth import printable_ascii
from gpuroute.openai_api import clip
from gpuroute.prompt import prefix_blocks, prompt_text, prompt_tokens, prompts_in

PRIORITY_HEADER = "x-gpuroute-priority"
DEADLINE_HEADER = "x-gpuroute-deadline-ms"
SESSION_HEADERS = ("x-session-id", "x-gpuroute-session")

# Which top-level key carries the prompt, per route, and whether it is required.
PROMPT_KEYS = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
}


class RequestError(Exception):
    """A request we refuse, with the HTTP status and OpenAI error fields to answer with."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass(slots=True)
class ParsedRequest:
    info: RequestInfo
    stream: bool
    deadline_s: float | None  # relative, from the deadline header
    outputs: int = 1  # answers it asks for: `n` (or `best_of`) times the prompts it holds


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"'{key}' must be a positive integer", param=key)
    return value


def parse_request(
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    request_id: int,
    *,
    priorities: tuple[str, ...],
    default_priority: str,
    with_prefix_blocks: bool = True,
    longest_deadline_s: float = math.inf,
) -> ParsedRequest:
    """`with_prefix_blocks=False` skips hashing the prompt when no policy reads the blocks;
    the deadline header may only shorten `longest_deadline_s` (the router's default)."""
    body = _json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' is required and must be a string", param="model")
    _check_prompt(body, PROMPT_KEYS.get(path))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", param="stream")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    choices = max(_positive_int(body, "n") or 1, _positive_int(body, "best_of") or 1)
    text = prompt_text(body)
    priority = headers.get(PRIORITY_HEADER, default_priority).strip().lower()
    if priority not in priorities:
        raise RequestError(
            400,
            f"unknown priority {clip(priority)!r}; known: {', '.join(priorities)}",
            param=PRIORITY_HEADER,
        )
    deadline_s = _deadline_s(headers.get(DEADLINE_HEADER))
    if deadline_s is not None:
        deadline_s = min(deadline_s, longest_deadline_s)
    session = _session(headers, body)
    info = RequestInfo(
        request_id,
        model,
        prompt_tokens(body),
        max_tokens,
        session_id=session,
        prefix_blocks=prefix_blocks(text) if with_prefix_blocks else (),
        priority=priority,
    )
    outputs = 0 if path == "/v1/embeddings" else choices * prompts_in(body)  # no answer text
    return ParsedRequest(info, stream, deadline_s, outputs)


def _session(headers: Mapping[str, str], body: dict) -> str | None:
    """The session id (a header, else the body's `user`), as a fixed-length digest: the id
    becomes a Redis key and a hash input, and a client may send a megabyte of it."""
    for name in SESSION_HEADERS:
        if name in headers:
            value = headers[name]
            if not printable_ascii(value):
                raise RequestError(400, f"{name} must be printable ASCII", param=name)
            break
    else:
        value = body.get("user")
        if not isinstance(value, str):
            return None
    return session_key(value)


def session_key(session: str) -> str:
    """A client's session id as the router keeps it: 32 hex characters, whatever its size."""
    return hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _json_object(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


def _check_prompt(body: dict, key: str | None) -> None:
    """The route's prompt field (`messages`, `prompt`, `input`) is present and not empty."""
    if key is None:
        return
    value = body.get(key)
    valid = isinstance(value, list) if key == "messages" else isinstance(value, str | list)
    if not valid or (isinstance(value, list) and not value):
        raise RequestError(400, f"'{key}' is required and must not be empty", param=key)
    if key == "messages" and not all(isinstance(m, dict) for m in value):
        raise RequestError(400, "each message must be an object", param="messages")


def _deadline_s(header: str | None) -> float | None:
    if header is None:
        return None
    try:
        deadline_s = float(header) / 1000
    except ValueError:
        deadline_s = -1.0
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise RequestError(
            400, f"{DEADLINE_HEADER} must be a positive, finite number of milliseconds"
        )
    return deadline_s
