"""Ports handed out for children to bind: never handed out twice while the child starts,
and bindable by a server the moment it starts (CI once gave two fake engines one port)."""

from __future__ import annotations

import asyncio
import socket

from gpuroute.testbed.ports import free_port, free_ports


def probe() -> int:
    """What the kernel hands the next bind of port 0 (as free_port did before)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_handed_out_is_not_handed_out_again_while_its_child_starts() -> None:
    handed = set(free_ports(20))
    assert len(handed) == 20
    others = {free_port() for _ in range(200)} | {probe() for _ in range(500)}
    assert handed.isdisjoint(others)


def test_a_server_binds_a_handed_out_port_at_once() -> None:
    async def serve(port: int) -> bytes:
        async def answer(reader, writer) -> None:
            writer.write(b"up")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", port)  # SO_REUSEADDR
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            got = await reader.read()
            writer.close()
            return got

    assert asyncio.run(serve(free_port())) == b"up"
