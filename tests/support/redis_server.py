"""A real `redis-server` on a free loopback port, for tests (Debian's package)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

from gpuroute.testbed.ports import free_port

HOW_TO_GET_REDIS = "redis-server not installed (make test installs Debian's redis-server as root)"


def redis_binary() -> str | None:
    return shutil.which("redis-server") or shutil.which("redis-server", path="/usr/sbin:/usr/bin")


class RedisServer:
    def __init__(self, workdir) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    def start(self, *extra: str, timeout: float = 10.0) -> None:
        """Start it (`extra`: more redis-server arguments, e.g. `--replicaof HOST PORT`)."""
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.ping():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


# A test of what replicas share gives Redis this per-call timeout: the router's 50 ms default
# (right on a request path) is exceeded on a loaded CI machine, and a call past it means "no
# shared state" by design, not the shared state under test.
SHARED_STATE_TIMEOUT_S = 5.0


def client(url: str | None, timeout_s: float = 0.05):
    """A redis-py asyncio client as a router builds one (short timeouts), or None."""
    import redis.asyncio as aioredis

    if url is None:
        return None
    return aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
