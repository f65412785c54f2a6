"""What the security tests share: a router config as an operator writes it (no loopback
conveniences), and an engine that records what reached it."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from dataclasses import dataclass

from aiohttp import web
from support.live import MODEL

from gpuroute.auth import key_digest

KEY, EU_KEY = "sk-tenant-acme", "sk-tenant-acme-eu"
ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def secure_toml(engine_url: str, *, top: str = "", **sections: str) -> str:
    """A router config with the defaults an operator gets, admin on a free loopback port."""
    lines = [top, "[listen]\nport = 0", "[admin_listen]\nport = 0"]
    lines += [f"[{name}]\n{body}" for name, body in sections.items()]
    lines.append(f'[[backends]]\nurl = "{engine_url}"\ngpu = "H100"\nmodels = ["{MODEL}"]')
    return "\n".join(lines) + "\n"


def keys_section(*extra: str, required: bool = False) -> str:
    lines = [f"required = {str(required).lower()}"] if required else []
    lines += [f'[[auth.keys]]\nsha256 = "{key_digest(KEY)}"\ntenant = "acme"', *extra]
    return "\n".join(lines)


class RecordingEngine:
    """Answers every request like an OpenAI engine would; records path, headers, body.
    `fail_when` (a predicate on the body) makes it answer 500, as an engine does on a body
    it chokes on; `hold` makes it wait until released."""

    def __init__(self, fail_when=None) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.fail_when = fail_when
        self.hold: asyncio.Event | None = None
        self.started = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.path, dict(request.headers), body))
        self.started += 1
        if request.headers.get("Content-Encoding") == "gzip":
            try:
                body = gzip.decompress(body)
            except OSError:
                return web.json_response({"error": "cannot decode gzip body"}, status=500)
        if self.fail_when is not None and self.fail_when(body):
            return web.json_response({"error": "engine crashed on this input"}, status=500)
        if self.hold is not None:
            await self.hold.wait()
        return web.json_response(ANSWER)

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.seen]


def chat(text: str = "hello", **extra) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    body.update(extra)
    return json.dumps(body).encode()


def raw_exchange(port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, read until the server closes or `timeout`; what came back."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]  # lowercase names
    body: bytes

    def json(self):
        return json.loads(self.body)


def post_raw(
    url: str, headers: list[tuple[str, str]], body: bytes, path: str = "/v1/chat/completions"
) -> RawAnswer:
    """POST with exactly these header lines, duplicates and spellings as given (aiohttp's
    client folds duplicates into one)."""
    port = int(url.rsplit(":", 1)[1])
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = top.decode("latin-1").split("\r\n")
    answer = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        answer[name.strip().lower()] = value.strip()
    if answer.get("transfer-encoding") == "chunked":
        rest = _unchunk(rest)
    return RawAnswer(int(status_line.split(" ")[1]), answer, rest)


async def send_raw(
    url: str, headers: list[tuple[str, str]], body: bytes, path: str = "/v1/chat/completions"
) -> RawAnswer:
    """post_raw from a thread, so servers in this event loop can answer it."""
    return await asyncio.to_thread(post_raw, url, headers, body, path)


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + data[:n], data[n + 2 :]
    return out


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0


def error_of(response: bytes) -> dict:
    """The OpenAI error object in a raw answer's (Content-Length framed) JSON body."""
    return json.loads(response.partition(b"\r\n\r\n")[2])["error"]
