"""OpenAI wire format shared by the router and the fake engine: errors and SSE framing.

Errors follow OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so clients
(the official `openai` package included) raise their usual typed exceptions."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
from aiohttp import web

from gpuroute.audio import AudioError, parse_audio_form
from gpuroute.config import LimitsConfig

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}
SSE_DONE = b"data: [DONE]\n\n"
# every API path the tiers route (POST), each scheduled as its kind of work (router/api/table.py)
API_ROUTES = (
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
    "/v1/messages/count_tokens", "/v1/embeddings", "/pooling", "/classify", "/v1/rerank",
    "/rerank", "/v2/rerank", "/v1/score", "/score", "/v1/audio/transcriptions",
    "/v1/audio/translations", "/tokenize", "/detokenize",
)  # fmt: skip
# Arrays and objects nested in one another at most this deep in a request body: orjson reads
# 1,024 levels but writes only 255, and a body the router edits is written again (a stream's
# usage asked for, an alias's model set, a Responses turn expanded). Real bodies nest far
# less: a tool's JSON schema 10 to 30 levels.
MAX_JSON_DEPTH = 128
TOO_DEEP = f"request body has nesting deeper than {MAX_JSON_DEPTH} levels of arrays and objects"
# JSON's syntax that strings can hide: quotes, backslashes and what a backslash escapes
# (kept so that each escape stays whole), and the brackets; the rest deleted in one pass
_NOT_SYNTAX = bytes(b for b in range(256) if b not in b'"\\/bfnrtu[]{}')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# [ and { one level in, ] and } one level out (-1 as an int8)
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def json_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests arrays and objects more than `limit` levels deep (brackets
    inside strings do not count). One pass over the bytes in C keeps the syntax strings can
    hide; most bodies then hold too few brackets to be deep, and the rest is done on what
    was kept: escaped backslashes then escaped quotes out (each quote left opens or closes
    a string), the strings out, the depth as a running sum."""
    kept = raw.translate(None, _NOT_SYNTAX)
    if kept.count(b"[") + kept.count(b"{") <= limit:
        return False
    quoted = kept.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')
    steps = b"".join(quoted[::2]).translate(_STEPS, _NOT_BRACKETS)
    if len(steps) <= limit:
        return False
    return int(np.frombuffer(steps, np.int8).cumsum(dtype=np.int32).max()) > limit


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        error_body(status, message, code=code, param=param), status=status, headers=headers
    )


class Rejection(Exception):
    """A refusal answered in OpenAI's error format (401, 403, 404, 413, 429, 503, 504...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.code, self.param, self.headers = code, param, headers

    def response(self) -> web.Response:
        return error_response(
            self.status, self.message, param=self.param, code=self.code, headers=self.headers
        )


async def read_body(request: web.Request, limits: LimitsConfig) -> bytes:
    """The whole request body, as both tiers read it: a declared length over
    `max_body_bytes` is refused before a byte is read (413), and the body must arrive within
    `body_timeout_s` (408), so a client trickling it cannot hold a connection."""
    too_large = f"request body exceeds {limits.max_body_bytes} bytes"
    if (request.content_length or 0) > limits.max_body_bytes:
        raise Rejection(413, too_large)
    try:
        if request.content.is_eof():  # all here already (most bodies): no deadline to arm
            return await request.read()
        async with asyncio.timeout(limits.body_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise Rejection(413, too_large) from None
    except TimeoutError:
        message = f"request body not received within {limits.body_timeout_s:g} s"
        raise Rejection(408, message, code="body_timeout") from None


def models_response(names) -> web.Response:
    """GET /v1/models for the names given, as the routers answer it."""
    created = int(time.time())
    data = [
        {"id": m, "object": "model", "created": created, "owned_by": "gpuroute"}
        for m in sorted(set(names))
    ]
    return web.json_response({"object": "list", "data": data})


async def not_found(request: web.Request) -> web.Response:
    """Every path and method no route takes, in OpenAI's format (the path clipped); a wrong
    method on an API route is a 405."""
    if request.path in API_ROUTES:
        message = f"{request.method} is not allowed on {request.path}; use POST"
        return error_response(405, message, code="method_not_allowed")
    return error_response(404, f"no route {request.method} {clip(request.path)}", code="not_found")


def clip(text: str, limit: int = 80) -> str:
    """What a client sent, echoed in an error without echoing a megabyte of it."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def healthz(_request: web.Request) -> web.Response:
    """Liveness: 200 while the process serves."""
    return web.json_response({"status": "ok"})


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def sse_error(status: int, message: str, *, code: str) -> bytes:
    """The explicit last event of a stream that broke after bytes reached the client."""
    return sse_event(error_body(status, message, code=code))


def request_model(path: str, body: bytes, content_type: str | None) -> tuple[str, dict | None]:
    """The model a request body names, as the global tier reads it before choosing a
    region: the JSON body's `model`, or an audio upload's `model` form field; Rejection
    (400) otherwise. With it, the JSON body (None: an upload)."""
    if path.startswith("/v1/audio/"):
        try:
            return parse_audio_form(body, content_type or "").model, None
        except AudioError as exc:
            raise Rejection(400, exc.message, param=exc.param) from None
    if json_too_deep(body):
        raise Rejection(400, TOO_DEEP)
    try:
        parsed = json.loads(body)
    except ValueError:
        raise Rejection(400, "body is not valid JSON") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("model"), str):
        raise Rejection(400, "'model' is required and must be a string", param="model")
    return parsed["model"], parsed
