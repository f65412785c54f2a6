"""Streams relayed less what a tier asked the engine for on its client's behalf: the
usage chunk (router/usage/tokens.py asks for it on every completions-family stream, so
quotas and usage records read what the engine counted) and the token ids a stream that may
be continued asks for (gpuroute/continuation/text.py `ask_token_ids`). The tally still counts,
and keeps, every byte as it came."""

from __future__ import annotations

import re

from gpuroute.relay.body import ResponseTally

USAGE_ONLY = re.compile(rb'"choices"\s*:\s*\[\s*\]')
HOLD_LIMIT = 4096  # an unfinished event held back at most (a usage chunk is far smaller)
# ... and where token ids are dropped (a first event's prompt ids: 8 bytes a token at most)
IDS_HOLD_LIMIT = 1024 * 1024
# an engine's error event (vLLM's when a generation fails mid-stream): an event's first line
ERROR_EVENT = b'{"error"'
ERROR_AT = re.compile(rb'(?:^|\n\n)(data: \{"error")')
TOKEN_IDS = re.compile(rb',\s*"(?:prompt_)?token_ids"\s*:\s*(?:\[[\d,\s]*\]|null)')


def usage_asked(body: dict) -> bool:
    """The client asked for a stream's usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def without_usage(data: bytes) -> bytes:
    """`data` (whole SSE events) less its usage-only events."""
    if b'"usage"' not in data:
        return data
    events = data.split(b"\n\n")
    kept = [e for e in events if not (b'"usage"' in e and USAGE_ONLY.search(e))]
    return data if len(kept) == len(events) else b"\n\n".join(kept)


def without_token_ids(data: bytes) -> bytes:
    """`data` (whole SSE events) less the token ids the router asked for."""
    return TOKEN_IDS.sub(b"", data) if b'token_ids"' in data else data


class StrippingTally(ResponseTally):
    """A ResponseTally that counts every chunk as it came and hands the client each one
    without what the router asked for on its behalf: the usage chunk (`usage`), the token
    ids (`token_ids`). An event split across chunks is held back until its end arrives (a
    client can do nothing with half an event), never more than the hold limit, and only
    once the stream is seen framed with blank lines (with `token_ids`, the first event is
    held for its prompt ids; a stream framed with CRLF passes as it comes). Events whole, an
    engine's error event ends a stream that is kept to be continued: held back, the stream
    broken (`engine_error`)."""

    __slots__ = ("_framed", "_hold_limit", "_newline", "_partial", "_passing", "_token_ids",
                 "_usage")  # fmt: skip
    strip = True

    def __init__(
        self, *, usage: bool = True, token_ids: bool = False, read_usage: bool = True
    ) -> None:
        super().__init__(size_text=True, read_usage=read_usage)
        self._usage, self._token_ids = usage, token_ids
        self._hold_limit = IDS_HOLD_LIMIT if token_ids else HOLD_LIMIT
        self._partial = b""
        self._framed = False  # a blank line seen: events can be told apart
        self._newline = False  # what went before ended in a newline (not yet framed)
        self._passing = False  # framed otherwise (CRLF): relayed as it comes

    def outgoing(self, chunk: bytes) -> bytes:
        if self.engine_error is not None:
            return b""  # (what followed it: [DONE])
        if not self._framed and not self._token_ids:  # ids come in the first event
            if b"\n\n" not in (b"\n" + chunk if self._newline else chunk):
                self._newline = chunk.endswith(b"\n")
                return chunk
            self._framed = True
        if self._passing:
            return chunk
        data = self._partial + chunk if self._partial else chunk
        cut = data.rfind(b"\n\n") + 2
        if cut == 1:  # no event ends here
            if not self._framed and b"\r\n\r\n" in data:
                self._passing, self._partial = True, b""
                return data
            if len(data) > self._hold_limit:
                self._partial = b""
                return data
            self._partial = data
            return b""
        self._framed = True
        rest = len(data) - cut
        if 0 < rest <= self._hold_limit:
            self._partial, data = data[cut:], data[:cut]
        else:
            self._partial = b""
        return self._stripped(self._before_error(data))

    def flush(self) -> bytes:
        data, self._partial = self._partial, b""
        return self._stripped(data) if self.engine_error is None else b""

    def _before_error(self, data: bytes) -> bytes:
        """`data` up to an engine's error event, where the stream is kept to go on (what is
        kept then ends before it, as what the client received does)."""
        if self.kept is None or ERROR_EVENT not in data:
            return data
        found = ERROR_AT.search(data)
        if found is None:
            return data
        at = found.start(1)
        self.engine_error = data[at:]
        del self.kept[len(self.kept) - (len(data) - at) - len(self._partial) :]
        self._partial = b""
        return data[:at]

    def _stripped(self, data: bytes) -> bytes:
        if self._usage:
            data = without_usage(data)
        return without_token_ids(data) if self._token_ids else data
