"""What every log line about a request carries: its id, set once where the request is
admitted and read by the log formatter (a ContextVar, so each request's task sees its own)."""

from __future__ import annotations

from contextvars import ContextVar

REQUEST_ID: ContextVar[str | None] = ContextVar("gpuroute_request_id", default=None)
