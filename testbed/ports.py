"""Free loopback ports for the demo, benchmarks and tests.

A port found free is only a number until its process binds it, which may be a second
later (a child still starting), and meanwhile the kernel may hand the same number to the
next probe: two fake engines once got one port. So each port handed out is left in
TIME_WAIT (Yelp's ephemeral-port-reserve technique): a connection to it is accepted and
closed from the listening side. For about a minute the kernel then gives that port to no
other bind of port 0, in this process or another, while a server that sets SO_REUSEADDR
binds it at once; asyncio and aiohttp, uvicorn, gRPC, Go, Rust's std, redis-server,
HAProxy and NGINX all do."""

from __future__ import annotations

import contextlib
import socket


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free right now (all bound at once, so none repeats), each held
    back from other probes for the next minute (TIME_WAIT)."""
    listeners: list[socket.socket] = []
    try:
        for _ in range(n):
            listener = socket.socket()
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
        return [_left_in_time_wait(listener) for listener in listeners]
    finally:
        for listener in listeners:
            listener.close()


def _left_in_time_wait(listener: socket.socket) -> int:
    """The listener's port, after one connection to it was accepted and closed from the
    listening side first (the side that closes first holds TIME_WAIT)."""
    address = listener.getsockname()
    with contextlib.closing(socket.create_connection(address, timeout=5)):
        accepted, _ = listener.accept()
        accepted.close()
    return address[1]


def free_port() -> int:
    return free_ports(1)[0]
