"""Anthropic's error format on the Messages API routes. The router answers every refusal in
OpenAI's format (`gpuroute/openai_api.py`); on these routes a middleware rewrites the ones
the router made into `{"type": "error", "error": {"type", "message"}}`, so an `anthropic`
client raises its own exception classes, and a stream that breaks ends with Anthropic's
`event: error`. What an engine answers is relayed as it came (vLLM answers these routes in
Anthropic's format itself)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

import orjson
from aiohttp import web

# Anthropic's error types by status (docs.anthropic.com, "Errors")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
KEPT_HEADERS = ("retry-after", "x-request-id")
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")  # answered in this format


def error_type(status: int) -> str:
    """The type Anthropic names a status by: a client's mistake for other 4xx, an API
    error for other 5xx (503, the router's shedding, is Anthropic's overloaded)."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    if status == 503:
        return "overloaded_error"
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def anthropic_stream_error(message: str) -> bytes:
    """The explicit last event of a Messages stream that broke after its first bytes."""
    body = orjson.dumps(anthropic_error_body(502, message))
    return b"event: error\ndata: " + body + b"\n\n"


def translated(response: web.StreamResponse) -> web.StreamResponse:
    """An OpenAI-format error the router made, in Anthropic's format; anything else as it is."""
    if not isinstance(response, web.Response) or response.status < 400:
        return response
    try:
        body = orjson.loads(response.body)  # type: ignore[arg-type]
        message = body["error"]["message"]
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return response
    if not isinstance(message, str) or body.get("type") == "error":
        return response
    headers = {k: response.headers[k] for k in KEPT_HEADERS if k in response.headers}
    return web.json_response(
        anthropic_error_body(response.status, message), status=response.status, headers=headers
    )


def anthropic_errors(paths: Collection[str]):
    """A middleware answering errors on `paths` in Anthropic's format."""
    paths = frozenset(paths)

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        return translated(response) if request.path in paths else response

    return middleware
