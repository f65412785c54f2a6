"""The executors `gpuroute scale` hands desired sizes to in production: a command that reads
the JSON on stdin, or a webhook that receives it in a POST. Both have a deadline; a
failure says why in one line and the scaler calls again at its next round.

A webhook resizes the fleet, so it is sent over https, or plain http to loopback only,
unless the operator allows plain http elsewhere; its bearer token comes from a file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from urllib.parse import urlsplit

import aiohttp
from gpuroute.router.core.scale_targets import PoolTarget, document
from gpuroute.router.scaling.scaler import ExecutorFailed

from gpuroute.config import is_loopback

log = logging.getLogger("gpuroute.scale")


def _body(targets: Mapping[str, PoolTarget]) -> bytes:
    return json.dumps(document(targets)).encode()


def _tail(data: bytes, limit: int = 300) -> str:
    text = data.decode(errors="replace").strip()
    return text[-limit:] if text else "(nothing on stderr)"


class CommandExecutor:
    """Runs `argv` (no shell) once per change, the JSON on its stdin; exit 0 is taken."""

    name = "command"

    def __init__(self, argv: list[str], timeout_s: float = 30.0) -> None:
        if not argv:
            raise ValueError("--command: empty")
        self.argv, self.timeout_s = argv, timeout_s

    async def apply(self, targets: Mapping[str, PoolTarget]) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise ExecutorFailed(f"cannot run {self.argv[0]}: {exc}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(_body(targets)), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise ExecutorFailed(f"{self.argv[0]} ran past {self.timeout_s:g} s; killed") from None
        if out.strip():
            log.info("%s: %s", self.argv[0], _tail(out))
        if proc.returncode != 0:
            raise ExecutorFailed(f"{self.argv[0]} exited {proc.returncode}: {_tail(err)}")

    async def close(self) -> None:
        return None


def webhook_refusal(url: str, allow_http: bool) -> str | None:
    """Why `url` may not receive the sizes (None: it may)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL"
    if parts.scheme == "http" and not allow_http and not is_loopback(parts.hostname):
        return f"{url} is plain http off loopback; use https, or allow it with --allow-http"
    return None


class WebhookExecutor:
    """POSTs the JSON to `url` (with `token` as a bearer token); any 2xx is taken."""

    name = "webhook"

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.url, self.token, self.timeout_s = url, token, timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def apply(self, targets: Mapping[str, PoolTarget]) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            async with self._session.post(
                self.url, data=_body(targets), headers=headers, allow_redirects=False
            ) as response:
                if not 200 <= response.status < 300:
                    text = (await response.text())[:300]
                    raise ExecutorFailed(f"{self.url} answered {response.status}: {text}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ExecutorFailed(f"{self.url}: {exc or type(exc).__name__}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
