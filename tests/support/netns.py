"""A small lab of network namespaces on one bridge: each "host" its own network stack, so a
Consul cluster, agents and engines can be killed or cut off one host at a time.

Only the lab's own private subnet, namespaces and links are ever addressed or changed; every
name carries a per-run tag and everything is removed on close."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def netns_available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"grprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def free_octet() -> int:
    """X of a 10.X.0.0/24 that no interface here holds: labs run side by side (xdist's
    workers, other checkouts' runs), and two bridges on one subnet would cross-route."""
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    used = {int(x) for x in re.findall(r"inet 10\.(\d+)\.", shown.stdout)}
    return random.choice([x for x in range(100, 250) if x not in used])


def _ip(*args: str, ns: str | None = None, check: bool = True) -> None:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    subprocess.run(cmd, check=check, capture_output=True)


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    link: str  # the bridge side of the host's veth pair


class NetnsLab:
    def __init__(self, workdir: Path) -> None:
        self.tag = f"g{os.getpid() % 10000}{random.randrange(10)}"
        self.octet = free_octet()
        self.bridge = f"br{self.tag}"
        self.workdir = workdir
        self.hosts: dict[str, Host] = {}
        self.procs: list[subprocess.Popen] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    @property
    def gateway(self) -> str:
        """The bridge's address in the root namespace, where the tests and router run."""
        return f"10.{self.octet}.0.1"

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 10
        host = Host(name, f"{self.tag}-{name}", f"10.{self.octet}.0.{index}", f"v{self.tag}{index}")
        peer = host.link + "p"
        subprocess.run(["ip", "netns", "add", host.ns], check=True, capture_output=True)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", host.ns)
        _ip("link", "set", host.link, "master", self.bridge, "up")
        _ip("addr", "add", f"{host.ip}/24", "dev", peer, ns=host.ns)
        _ip("link", "set", peer, "up", ns=host.ns)
        _ip("link", "set", "lo", "up", ns=host.ns)
        self.hosts[name] = host
        return host

    def popen(self, host: Host, cmd: list[str], log_name: str) -> subprocess.Popen:
        log = (self.workdir / f"{log_name}.log").open("ab")
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, *cmd], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()
        self.procs.append(proc)
        return proc

    def kill_host(self, host: Host) -> None:
        """SIGKILL every process in the host's namespace, as a host crash would."""
        pids = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)

    def cut(self, host: Host) -> None:
        """Take the host's link down on the bridge side: a network partition."""
        _ip("link", "set", host.link, "down")

    def close(self) -> None:
        for host in self.hosts.values():
            self.kill_host(host)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for host in self.hosts.values():
            _ip("link", "del", host.link, check=False)
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
        _ip("link", "del", self.bridge, check=False)
