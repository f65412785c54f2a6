"""A real Redis Sentinel deployment on free loopback ports, for tests: one primary, one
replica and three sentinels (Debian's redis-server; `--sentinel` runs it as a sentinel),
in plaintext or, given a CA, with TLS only (replication and sentinels too), and with
passwords when given. Every step waits on what Redis reports (INFO replication, SENTINEL MASTER,
get-master-addr-by-name), never on time."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import redis
from gpuroute.testbed.certs import LocalCA
from gpuroute.testbed.ports import free_port

from support.redis_server import redis_binary

SERVICE = "gpuroute"
# a primary silent this long is subjectively down: short for a test, yet not so short that
# a sentinel starved on a loaded 2-core machine fails over a primary that is up (1 s did)
DOWN_AFTER_MS = 3000
FAILOVER_TIMEOUT_MS = 10_000


class Security:
    """TLS (a CA issues every node's certificate) and passwords, or neither."""

    def __init__(
        self, ca: LocalCA | None = None, password: str | None = None, sentinel_password=None
    ) -> None:
        self.ca, self.password, self.sentinel_password = ca, password, sentinel_password
        self.cert = ca.issue("redis") if ca is not None else None

    def listen(self, port: int) -> list[tuple[str, str]]:
        """A node's listening directives as (name, value): TLS only when there is a CA."""
        if self.ca is None or self.cert is None:
            return [("port", str(port))]
        cert, key = self.cert
        return [
            ("port", "0"), ("tls-port", str(port)), ("tls-cert-file", str(cert)),
            ("tls-key-file", str(key)), ("tls-ca-cert-file", str(self.ca.ca_file)),
            ("tls-replication", "yes"), ("tls-auth-clients", "no"),
        ]  # fmt: skip

    def client(self, port: int, password: str | None) -> redis.Redis:
        tls = {"ssl": True, "ssl_ca_certs": str(self.ca.ca_file)} if self.ca else {}
        return redis.Redis(
            port=port, socket_timeout=2, decode_responses=True, password=password, **tls
        )


class RedisNode:
    """One redis-server (a data node or a sentinel) with its log in `workdir`."""

    def __init__(self, workdir: Path, name: str, security: Security, sentinel: bool) -> None:
        self.workdir, self.name = workdir, name
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        password = security.sentinel_password if sentinel else security.password
        self.client = security.client(self.port, password)

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

    def __init__(
        self, workdir: Path, security: Security | None = None, min_replicas: int = 0
    ) -> None:
        """`min_replicas`: the data nodes' min-replicas-to-write (a primary without that
        many replicas refuses writes instead of taking writes a failover would drop)."""
        self.workdir, self.security = workdir, security or Security()
        self.min_replicas = min_replicas
        self.primary = RedisNode(workdir, "redis-a", self.security, False)
        self.replica = RedisNode(workdir, "redis-b", self.security, False)
        self.sentinels = [
            RedisNode(workdir, f"sentinel-{i}", self.security, True) for i in range(3)
        ]

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    def start(self) -> None:
        self._data_node(self.primary)
        self._data_node(self.replica, "--replicaof", "127.0.0.1", str(self.primary.port))
        self._wait_replicating(self.replica, self.primary)
        for sentinel in self.sentinels:
            conf = self.workdir / f"{sentinel.name}.conf"
            conf.write_text("\n".join([*self._sentinel_conf(sentinel), ""]))
            # a sentinel rewrites its config, so each has its own file
            sentinel.start(str(conf), "--sentinel")
        wait(self._sentinels_agree, "3 sentinels that see each other and the replica")

    def _sentinel_conf(self, sentinel: RedisNode) -> list[str]:
        listen = [f"{name} {value}" for name, value in self.security.listen(sentinel.port)]
        lines = [*listen, "bind 127.0.0.1", f"dir {self.workdir}",
                 f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2",
                 f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                 f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}"]  # fmt: skip
        if self.security.password:
            lines.append(f"sentinel auth-pass {SERVICE} {self.security.password}")
        if self.security.sentinel_password:  # its own, which its peers must give too
            lines.append(f"requirepass {self.security.sentinel_password}")
            lines.append(f"sentinel sentinel-pass {self.security.sentinel_password}")
        return lines

    def _data_node(self, node: RedisNode, *extra: str) -> None:
        listen = [arg for n, v in self.security.listen(node.port) for arg in (f"--{n}", v)]
        auth = self.security.password
        node.start(
            *listen,
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.workdir), "--dbfilename", f"{node.name}.rdb",
            "--repl-diskless-sync-delay", "0",
            "--min-replicas-to-write", str(self.min_replicas), "--min-replicas-max-lag", "2",
            *(("--requirepass", auth, "--masterauth", auth) if auth else ()), *extra,
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
