"""Public listeners that a slow or greedy client cannot hold open: a cap on connections per
client address, and TLS when a certificate is configured.

Behind an L7 load balancer every client shares the balancer's address (and it keeps idle
keep-alive connections open), so connections from `trusted_proxies` are not capped; the
clients their X-Forwarded-For names are, each to as many requests in flight
(`forwarded_client_cap`).

The header-read deadline is aiohttp's own keep-alive timer (`keepalive_timeout`): it closes
a connection that has not delivered a complete request head that long after opening or
after its last response, however slowly bytes trickle in. The body-read deadline is
`openai_api.read_body`'s (`limits.body_timeout_s`)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

from gpuroute.forwarded import TrustedProxies, client_key
from gpuroute.openai_api import error_response

log = logging.getLogger("gpuroute.listener")


class ConnectionCap:
    """Open connections (or requests) per client address (an IPv6 client's /64), refused
    beyond `per_ip`; addresses in `exempt` are never counted."""

    def __init__(self, per_ip: int, exempt: TrustedProxies | None = None) -> None:
        self.per_ip = per_ip
        self.exempt = exempt
        self.open: Counter[str] = Counter()

    def acquire(self, address: str) -> bool:
        if self.exempt and self.exempt.trusts(address):
            return True
        key = client_key(address)
        if self.open[key] >= self.per_ip:
            return False
        self.open[key] += 1
        return True

    def release(self, address: str) -> None:
        key = client_key(address)
        if key not in self.open:
            return  # exempt, never counted
        self.open[key] -= 1
        if self.open[key] <= 0:
            del self.open[key]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def forwarded_client_cap(
    proxies: TrustedProxies, per_client: int
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Middleware: a request through a trusted proxy counts against the client its
    X-Forwarded-For names (every line, walked from the right as both tiers walk it); past
    `per_client` in flight, 429."""
    cap = ConnectionCap(per_client)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not proxies.trusts(request.remote):
            return await handler(request)
        chain = ", ".join(request.headers.getall("X-Forwarded-For", ()))
        client = proxies.client_address(request.remote, chain) or "unknown"
        if not cap.acquire(client):
            message = f"{per_client} requests in flight from this client, the limit"
            return error_response(429, message, code="too_many_connections",
                                  headers={"Retry-After": "1"})  # fmt: skip
        try:
            return await handler(request)
        finally:
            cap.release(client)

    return guard


class _CappedProtocol(asyncio.Protocol):
    """Forwards everything to the HTTP protocol, after the cap let the connection in."""

    def __init__(self, inner: asyncio.Protocol, cap: ConnectionCap) -> None:
        self.inner, self.cap = inner, cap
        self.address: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) else "unknown"
        if not self.cap.acquire(address):
            log.warning("refused a connection from %s: %d open", address, self.cap.per_ip)
            transport.abort()  # type: ignore[attr-defined]
            return
        self.address = address
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.address is not None:
            self.cap.release(self.address)
            self.address = None
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.address is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.address is not None else None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections pass a per-address cap first."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        cap: ConnectionCap,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 1024,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(
            runner, host, port, ssl_context=ssl_context, backlog=backlog, reuse_port=reuse_port
        )
        self.cap = cap

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        factory: Callable[[], asyncio.Protocol] = lambda: _CappedProtocol(server(), self.cap)  # noqa: E731
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]
