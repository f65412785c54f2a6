"""A real Redis Sentinel deployment on free loopback ports, for tests: one primary, one
replica and three sentinels (Debian's redis-server; `--sentinel` runs it as a sentinel).
Every step waits on what Redis reports (INFO replication, SENTINEL MASTER,
get-master-addr-by-name), never on time."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import redis
from gpuroute.testbed.ports import free_port

from support.redis_server import redis_binary

SERVICE = "gpuroute"
# a primary silent this long is subjectively down: short for a test, yet not so short that
# a sentinel starved on a loaded 2-core machine fails over a primary that is up (1 s did)
DOWN_AFTER_MS = 3000
FAILOVER_TIMEOUT_MS = 10_000


class RedisNode:
    """One redis-server (a data node or a sentinel) with its log in `workdir`."""

    def __init__(self, workdir: Path, name: str, port: int | None = None) -> None:
        self.workdir, self.name = workdir, name
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.client = redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)

    def start(self, *args: str) -> None:
        log = (self.workdir / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen([redis_binary(), *args], stdout=log, stderr=log)
        log.close()
        wait(self.ping, f"{self.name} to answer PING", self.proc)

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: no goodbye to its replicas, clients or sentinels."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None
        self.client.close()

    def info(self) -> dict:
        return self.client.info("replication")


class SentinelDeployment:
    """Start with `start()`; `primary` and `replica` swap on each failover."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary = RedisNode(workdir, "redis-a")
        self.replica = RedisNode(workdir, "redis-b")
        self.sentinels = [RedisNode(workdir, f"sentinel-{i}") for i in range(3)]

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    def start(self) -> None:
        self._data_node(self.primary)
        self._data_node(self.replica, "--replicaof", "127.0.0.1", str(self.primary.port))
        self._wait_replicating(self.replica, self.primary)
        for sentinel in self.sentinels:
            conf = self.workdir / f"{sentinel.name}.conf"
            conf.write_text(
                f"port {sentinel.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            )  # a sentinel rewrites its config, so each has its own file
            sentinel.start(str(conf), "--sentinel")
        wait(self._sentinels_agree, "3 sentinels that see each other and the replica")

    def _data_node(self, node: RedisNode, *extra: str) -> None:
        node.start(
            "--port", str(node.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir),
            "--dbfilename", f"{node.name}.rdb", "--repl-diskless-sync-delay", "0", *extra,
        )  # fmt: skip

    def _sentinels_agree(self) -> bool:
        try:
            for s in self.sentinels:
                master = s.client.sentinel_master(SERVICE)
                if (master["num-other-sentinels"], master["num-slaves"]) != (2, 1):
                    return False
                if master["port"] != self.primary.port:
                    return False
            return True
        except redis.RedisError:
            return False

    def _wait_replicating(self, replica: RedisNode, primary: RedisNode) -> None:
        def linked() -> bool:
            try:
                info = replica.info()
            except redis.RedisError:
                return False
            return (
                info.get("role") == "slave"
                and info.get("master_port") == primary.port
                and info.get("master_link_status") == "up"
            )

        wait(linked, f"{replica.name} replicating {primary.name}", timeout=30)

    def _wait_promoted(self, node: RedisNode) -> None:
        def everyone_says_so() -> bool:
            try:
                named = {s.client.sentinel_get_master_addr_by_name(SERVICE) for s in self.sentinels}
                return named == {("127.0.0.1", node.port)} and node.info()["role"] == "master"
            except redis.RedisError:
                return False

        wait(everyone_says_so, f"the sentinels to name {node.name} primary", timeout=30)

    def failover(self) -> None:
        """SENTINEL FAILOVER: the replica is promoted and the old primary follows it."""
        old, new = self.primary, self.replica
        self.sentinels[0].client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        self._wait_promoted(new)
        self._wait_replicating(old, new)
        self.primary, self.replica = new, old

    def kill_primary(self) -> None:
        """SIGKILL the primary, wait for the sentinels to promote the replica, then start
        the old primary again as the new one's replica. Without persistence it comes back
        empty: started as a primary, a failover could promote it and empty every copy
        (Redis's replication docs warn of this), so an operator restarts it as a replica."""
        old, new = self.primary, self.replica
        old.kill()
        self._wait_promoted(new)
        self.primary, self.replica = new, old
        self._data_node(old, "--replicaof", "127.0.0.1", str(new.port))
        self._wait_replicating(old, new)
        wait(self._sentinels_agree, "the sentinels to see the restarted node as replica")

    def stop(self) -> None:
        for node in (*self.sentinels, self.replica, self.primary):
            node.kill()


def wait(condition, what: str, proc: subprocess.Popen | None = None, timeout: float = 10.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` s or when
    `proc` has exited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
