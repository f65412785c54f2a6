"""HTTP-level parse errors answered in OpenAI's error format.

aiohttp refuses requests it cannot parse (a header line over 8,190 bytes, more than 128
headers, a garbled request line) before any handler runs, with a text/plain 400 and a
traceback in the log for each, as `HTTP/1.0` (the version it assumes for a request it could
not read) and with its own `Server: Python/... aiohttp/...` (app signals never run for it).
OpenAI clients expect the JSON error every other refusal uses, one misbehaving client
should not fill the log, and no answer names our library; this handler does all three."""

from __future__ import annotations

import logging

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import LineTooLong

from gpuroute.openai_api import error_response
from gpuroute.relay.body import SERVER_NAME

log = logging.getLogger("gpuroute.http")


def describe(exc: BaseException | None, message: str | None) -> str:
    """What was wrong, without echoing the client's bytes back at length."""
    if isinstance(exc, LineTooLong):
        return f"a request or header line is longer than {exc.args[1]} bytes"
    text = (message or "unparseable request").strip().splitlines()[0]
    return text if len(text) <= 160 else text[:157] + "..."


class OpenAIErrorHandler(web.RequestHandler):
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)  # it closes the connection
        if status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
            response = error_response(status, "internal error", code="internal_error")
        else:
            reason = describe(exc, message)
            log.info("refused a malformed HTTP request from %s: %s", request.remote, reason)
            text = f"malformed HTTP request: {reason}"
            response = error_response(status, text, code="bad_request")
        response.headers["Server"] = SERVER_NAME
        response.force_close()
        answer_as_http11(request)
        return response


def answer_as_http11(request: web.BaseRequest) -> None:
    """The status line says HTTP/1.1, not the 1.0 aiohttp assumed for a request it could not
    read. aiohttp has no public setter: the request's version is a cached property over
    `_version` (tests/security/test_router_paths.py fails if an upgrade changes that)."""
    if request.version < HttpVersion11:
        request._cache.pop("version", None)
        request._version = HttpVersion11


class OpenAIErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return OpenAIErrorHandler(self, loop=self._loop, **self._kwargs)


def answer_parse_errors_as_openai(runner: web.BaseRunner) -> None:
    """After runner.setup(): its connections use OpenAIErrorHandler. aiohttp has no public
    hook for this; tests/integration/test_quotas.py fails if an upgrade breaks it."""
    server = runner.server
    assert server is not None, "call after runner.setup()"
    server.__class__ = OpenAIErrorServer
