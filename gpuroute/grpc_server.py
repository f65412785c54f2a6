"""Starting a grpc.aio server the way every gpuroute stream service wants it: one port of
its own (no SO_REUSEPORT sharing), and a busy port reported as an OSError naming it."""

from __future__ import annotations

from collections.abc import Callable

import grpc


async def start_grpc_server(
    add_servicer: Callable[[grpc.aio.Server], None], host: str, port: int, what: str
) -> tuple[grpc.aio.Server, int]:
    """Start a server with the servicer `add_servicer` registers; returns it and its port."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    add_servicer(server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # grpc reports a busy port this way
        raise OSError(f"{what}: cannot listen on {host}:{port} (in use?)") from exc
    await server.start()
    return server, bound
