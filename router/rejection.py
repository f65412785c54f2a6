"""The one way the router refuses a request before a backend sees it."""

from __future__ import annotations

from aiohttp import web

from gpuroute.openai_api import error_response


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
