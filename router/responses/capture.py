"""The finished response object, read from a Responses answer as it is relayed: a whole JSON
body, or a stream's terminal event (`response.completed`, or `response.incomplete`), however
the engine's chunks split its events. Used only on /v1/responses (every other route keeps
the plain ResponseTally), and bounded: past `limit` bytes of one body or one event nothing
more is kept and nothing is found."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gpuroute.relay.body import ResponseTally

TERMINAL = (b"response.completed", b"response.incomplete")
TERMINAL_TYPE = re.compile(rb'"type"\s*:\s*"response\.(?:completed|incomplete)"')
KEPT_STATUSES = frozenset({"completed", "incomplete"})  # a finished answer, to continue


def terminal_response(event: bytes) -> dict[str, Any] | None:
    """The response object of a terminal SSE event (None: any other event)."""
    head = event[:64]
    if head.startswith(b"event:"):
        if not any(name in head.split(b"\n", 1)[0] for name in TERMINAL):
            return None
    elif TERMINAL_TYPE.search(event) is None:
        return None
    data = b"".join(
        line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    )
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    response = doc.get("response") if isinstance(doc, dict) else None
    return response if finished(response) else None


def finished(response: Any) -> bool:
    return (
        isinstance(response, dict)
        and response.get("object") == "response"
        and response.get("status") in KEPT_STATUSES
    )


class CapturedAnswer(ResponseTally):
    """A ResponseTally that also hands the finished response object to `on_done`, once,
    as soon as its last bytes are here (before they are written to the client, so a
    follow-up the client sends on reading them finds it stored)."""

    __slots__ = ("_done", "_kept", "_limit", "_on_done", "_streamed")

    def __init__(
        self,
        streamed: bool,
        limit: int,
        on_done: Callable[[dict[str, Any]], Awaitable[None] | None],
    ) -> None:
        super().__init__(size_text=streamed)
        self._streamed, self._limit, self._on_done = streamed, limit, on_done
        self._kept = b""  # a whole body so far, or a stream's unfinished event
        self._done = False

    def add(self, chunk: bytes) -> None:
        super().add(chunk)
        if self._done or not chunk:
            return
        if self._streamed:
            self._events(chunk)
        else:
            self._body(chunk)

    def _body(self, chunk: bytes) -> None:
        self._kept += chunk
        if len(self._kept) > self._limit:
            self._give_up()
        elif self._kept.rstrip().endswith(b"}"):  # complete once it parses
            try:
                doc = orjson.loads(self._kept)
            except orjson.JSONDecodeError:
                return
            self._found(doc if finished(doc) else None)

    def _events(self, chunk: bytes) -> None:
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        data = self._kept + chunk
        end = data.rfind(b"\n\n")
        self._kept = data[end + 2 :] if end >= 0 else data  # an event not yet ended
        if len(self._kept) > self._limit:
            self._give_up()
            return
        if end < 0:
            return
        for event in data[:end].split(b"\n\n"):
            if (response := terminal_response(event)) is not None:
                self._found(response)
                return

    def _found(self, response: dict[str, Any] | None) -> None:
        self._give_up()
        if response is not None:  # the client's last bytes wait for what on_done returns
            self.hold = self._on_done(response)

    def _give_up(self) -> None:
        self._done, self._kept = True, b""
