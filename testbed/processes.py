"""Child processes on free loopback ports: started, waited for and stopped the same way.

The fake engine and Redis start here; the benchmarks add their proxies (bench/targets.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpuroute.testbed.ports import free_port


class StartError(RuntimeError):
    """A stand-in process cannot run (missing binary, a process that would not start)."""


def wait_http(
    url: str,
    timeout: float,
    child: Child | subprocess.Popen,
    what: str,
    context: ssl.SSLContext | None = None,
) -> None:
    """Poll `url` until it answers 200; fail if the process exits or time runs out, saying
    why with the tail of its log when it is a Child. `context`: for an https URL, whom to
    trust."""
    proc = child.proc if isinstance(child, Child) else child
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            said = log_tail(child.log) if isinstance(child, Child) else ""
            raise StartError(f"{what} exited with status {proc.returncode} while starting" + said)
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise StartError(f"{what} did not answer {url} within {timeout:.0f} s")
        time.sleep(0.05)


def log_tail(log: Path, lines: int = 20) -> str:
    """The last lines of a child's log, to follow an error message ("" when it has none)."""
    try:
        text = log.read_text(errors="replace").strip()
    except OSError:
        return ""
    if not text:
        return ""
    tail = "\n".join(text.splitlines()[-lines:])
    return f"; the last lines of its log ({log}):\n{tail}"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    port: int
    log: Path
    group: bool = False  # its own session: signals go to every process it started

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def signal(self, sig: signal.Signals) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
        elif self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(5)
        if self.group:  # children that outlived their parent
            self.signal(signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL, as a crash would (with `group`, the engine's workers too)."""
        self.signal(signal.SIGKILL)
        self.proc.wait(5)


def spawn(
    name: str,
    cmd: list[str],
    workdir: Path,
    port: int,
    *,
    cpu: int | None = None,
    env: dict[str, str] | None = None,
    group: bool = False,
) -> Child:
    """`env`: variables added to this process's environment for the child; `group`: start
    it in its own session, so that stopping it stops what it started (vLLM's workers)."""
    log = workdir / f"{name}.log"
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    child_env = {**os.environ, **env} if env else None
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=child_env,
            start_new_session=group,
        )
    return Child(name, proc, port, log, group)


def start_engine(
    workdir: Path,
    index: int,
    gpu: str,
    *,
    time_scale: float,
    stream_interval_ms: float,
    cpu=None,
    token_interval_ms: float | None = None,
    model: str | None = None,
    tensor_parallel: int = 1,
    specs: Path | None = None,
    served_name: str | None = None,
) -> Child:
    """`token_interval_ms`: one token per SSE event, this far apart (relay benchmarks);
    `model`: the shape it runs and the name it serves (default: the fake engine's);
    `specs`: a file whose [[gpu_types]] and [[models]] declare `gpu` and `model`;
    `served_name`: the name it serves instead of `model`'s."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "gpuroute.cli", "fake-engine", "--gpu", gpu, "--port", str(port),
        "--time-scale", str(time_scale), "--stream-interval-ms", str(stream_interval_ms),
        "--seed", str(index),
    ]  # fmt: skip
    if token_interval_ms is not None:
        cmd += ["--token-interval-ms", str(token_interval_ms)]
    if model is not None:
        cmd += ["--model", model]
    if tensor_parallel != 1:
        cmd += ["--tensor-parallel", str(tensor_parallel)]
    if specs is not None:
        cmd += ["--specs", str(specs)]
    if served_name is not None:
        cmd += ["--served-name", served_name]
    return spawn(f"engine-{index}-{gpu}", cmd, workdir, port, cpu=cpu)


def start_redis(workdir: Path, port: int | None = None) -> Child:
    """Debian's redis-server on a free port, no persistence (shared state for replicas),
    answering PING when this returns."""
    binary = require("redis-server")
    port = port or free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    child = spawn("redis", cmd, workdir, port)
    deadline = time.monotonic() + 10
    while not _answers_ping(port):
        if child.proc.poll() is not None or time.monotonic() > deadline:
            child.stop()
            raise StartError(f"redis-server did not start; see {child.log}")
        time.sleep(0.02)  # polling a port, bounded by the deadline
    return child


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def cache_dir() -> Path:
    """Where the tools the tests and benchmarks build once are kept (Consul, vLLM, ...)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuroute"


def installed_venv(name: str) -> Path | None:
    """The cached virtual environment `name`, once its build script finished it."""
    venv = cache_dir() / name
    return venv if (venv / ".installed").is_file() else None


def require(binary: str) -> str:
    path = shutil.which(binary) or (
        f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None
    )
    if path is None:
        raise StartError(
            f"{binary} not found; install it (Debian: apt-get install {binary}) "
            "or run `make bench-deps`"
        )
    return path
