"""What the client to engines writes: where to (an origin) and the request head, with the
framing its own and nothing that could end a header line early (gpuroute/upstream/client.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
UNSAFE_VALUE = re.compile(r"[\r\n\x00]")
# never taken from the caller: the client writes its own framing
OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass(frozen=True, slots=True)
class Origin:
    host: str
    port: int
    tls: bool
    host_header: str

    @property
    def address(self) -> str:
        """host:port, as logs and metrics name it."""
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        default = port == (443 if tls else 80)
        return cls(host, port, tls, shown if default else f"{shown}:{port}")


def request_head(
    method: str, target: str, origin: Origin, headers: Mapping[str, str], length: int
) -> bytes:
    """The request line and headers. A name or value that could end a header line early
    is refused, never sent (header injection into the engine connection)."""
    if not TOKEN.fullmatch(method) or UNSAFE_VALUE.search(target) or " " in target:
        raise ValueError(f"unsafe request line: {method!r} {target!r}")
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"]
    if length or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {length}\r\n")
    for name, value in headers.items():
        if not TOKEN.fullmatch(name) or UNSAFE_VALUE.search(value):
            raise ValueError(f"unsafe header {name!r}")
        if name.lower() not in OWN_HEADERS:
            lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")
