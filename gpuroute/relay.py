"""Header hygiene and response bookkeeping for relaying one upstream response."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping

import aiohttp

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Dropped on the way up: the client's framing and our own control headers.
REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}
RESPONSE_DROP = HOP_BY_HOP | {"content-length", "date", "server"}
# What a failed upstream attempt raises (connect, timeout, reset, protocol errors).
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
TAIL_BYTES = 1024


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    """Headers named in `Connection` are hop-by-hop too (RFC 9110 §7.6.1)."""
    value = headers.get("connection", "")
    return {t.strip().lower() for t in value.split(",") if t.strip()}


def forward_headers(items: Iterable[tuple[str, str]], drop: frozenset[str]) -> dict[str, str]:
    pairs = list(items)
    extra = _connection_tokens({k.lower(): v for k, v in pairs})
    out: dict[str, str] = {}
    for key, value in pairs:
        lower = key.lower()
        if lower in drop or lower in extra:
            continue
        out[key] = value
    return out


class ResponseTally:
    """Counts what went through: bytes, SSE events, and the usage tail if any."""

    __slots__ = ("bytes", "events", "tail")

    def __init__(self) -> None:
        self.bytes = 0
        self.events = 0
        self.tail = b""

    def add(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        self.events += chunk.count(b"data: ")
        self.tail = (self.tail + chunk)[-TAIL_BYTES:]

    def output_tokens(self, streamed: bool) -> int:
        """Usage's completion_tokens when present, else one token per content event."""
        found = COMPLETION_TOKENS.findall(self.tail)
        if found:
            return int(found[-1])
        if streamed:
            return max(0, self.events - 3)  # role, finish and [DONE] carry no tokens
        return 0
