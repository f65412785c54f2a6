"""Finding the pinned Consul binary and running a throwaway `consul agent -dev` on free
loopback ports, for the demo, the benchmarks and the tests (never in production)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from gpuroute.testbed.ports import free_ports
from gpuroute.testbed.processes import cache_dir

CONSUL_VERSION = "1.22.2"  # scripts/build-consul.sh builds the same one
HOW_TO_GET_CONSUL = (
    "Consul not found: run `make consul` (builds Consul "
    f"{CONSUL_VERSION} with Go from the module proxy into ~/.cache/gpuroute), or set "
    "GPUROUTE_CONSUL to a consul binary"
)


def consul_binary() -> Path | None:
    """GPUROUTE_CONSUL, else the cached build, else `consul` on PATH."""
    if env := os.environ.get("GPUROUTE_CONSUL"):
        return Path(env) if Path(env).is_file() else None
    cached = cache_dir() / f"consul-{CONSUL_VERSION}"
    if cached.is_file():
        return cached
    found = shutil.which("consul")
    return Path(found) if found else None


class ConsulDev:
    """`consul agent -dev` on loopback. `stop()` then `start()` is an outage: the ports
    stay, the state is gone (as with any dev agent)."""

    def __init__(
        self, binary: Path, *, log_path: Path | None = None, acl_token: str | None = None
    ) -> None:
        """`acl_token`: ACLs on, default deny, with this initial management token."""
        self.binary = binary
        self.acl_token = acl_token
        self.http_port, self.serf_lan, self.serf_wan, self.server_port = free_ports(4)
        self.address = f"http://127.0.0.1:{self.http_port}"
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="consul-dev-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [
            str(self.binary), "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
            "-http-port", str(self.http_port), "-dns-port", "-1", "-grpc-port", "-1",
            "-grpc-tls-port", "-1", "-serf-lan-port", str(self.serf_lan),
            "-serf-wan-port", str(self.serf_wan), "-server-port", str(self.server_port),
            "-hcl", 'telemetry { disable_hostname = true }',
        ] + (["-hcl", 'acl { enabled = true\ndefault_policy = "deny"\n'
              f'tokens {{ initial_management = "{self.acl_token}" }} }}']
             if self.acl_token else [])  # fmt: skip

    def start(self, timeout: float = 30.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"consul exited ({self.proc.returncode}); see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"consul not ready after {timeout} s; see {self.log_path}")
            time.sleep(0.05)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.address + "/v1/status/leader", timeout=1) as r:
                return r.status == 200 and len(r.read().strip(b'"\n')) > 0
        except OSError:
            return False

    def raft_index(self) -> int:
        """The server's last Raft log index: every catalog write moves it by one."""
        with urllib.request.urlopen(self.request("/v1/agent/self"), timeout=5) as r:
            return int(json.load(r)["Stats"]["raft"]["last_log_index"])

    def request(
        self, path: str, body: dict | None = None, method: str | None = None
    ) -> urllib.request.Request:
        """An HTTP API request carrying the management token when ACLs are on."""
        headers = {"X-Consul-Token": self.acl_token} if self.acl_token else {}
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(self.address + path, data, headers, method=method)

    def create_token(self, name: str, rules: str) -> str:
        """A policy with these rules and a token holding only it; its SecretID."""
        for path, body in (
            ("/v1/acl/policy", {"Name": name, "Rules": rules}),
            ("/v1/acl/token", {"Description": name, "Policies": [{"Name": name}]}),
        ):
            with urllib.request.urlopen(self.request(path, body, "PUT"), timeout=5) as r:
                created = json.load(r)
        return created["SecretID"]

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(15)
        self.proc = None

    def __enter__(self) -> ConsulDev:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop(signal.SIGTERM)
