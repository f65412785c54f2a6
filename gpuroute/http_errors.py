"""HTTP-level parse errors answered in OpenAI's error format.

aiohttp refuses requests it cannot parse (a header line over 8,190 bytes, more than 128
headers, a garbled request line) before any handler runs, with a text/plain 400 and a
traceback in the log for each. OpenAI clients expect the JSON error every other refusal
uses, and one misbehaving client should not fill the log; this handler does both."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from gpuroute.openai_api import error_response

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
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        reason = describe(exc, message)
        log.info("refused a malformed HTTP request from %s: %s", request.remote, reason)
        response = error_response(status, f"malformed HTTP request: {reason}", code="bad_request")
        response.force_close()
        return response


class OpenAIErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return OpenAIErrorHandler(self, loop=self._loop, **self._kwargs)


def answer_parse_errors_as_openai(runner: web.BaseRunner) -> None:
    """After runner.setup(): its connections use OpenAIErrorHandler. aiohttp has no public
    hook for this; tests/integration/test_quotas.py fails if an upgrade breaks it."""
    server = runner.server
    assert server is not None, "call after runner.setup()"
    server.__class__ = OpenAIErrorServer
