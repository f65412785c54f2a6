"""`gpuroute router --workers N`: N processes serve one public port (SO_REUSEPORT, the
kernel spreads connections over them), share their outstanding work through a board in
shared memory (`worker_board`), and answer as one on a single admin listener.

The parent process routes nothing: it starts the workers, restarts one that dies, serves
the admin listener (`worker_admin`), and on SIGTERM/SIGINT has every worker drain at once
and waits for them. Workers are fresh interpreters (`python -m gpuroute.cli router
--worker I/N`), never forks of a process that already runs an event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.observe.metrics import worker_families
from gpuroute.router.workers.admin import WorkerAdmin
from gpuroute.router.workers.board import create_board

from gpuroute.admin_guard import admin_guards
from gpuroute.serving import CUT_GRACE_S
from gpuroute.tls import server_context

log = logging.getLogger("gpuroute.router.workers.parent")
START_TIMEOUT_S = 120.0
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def board_path(run_dir: Path) -> Path:
    return run_dir / "load.board"


def admin_socket(run_dir: Path, index: int) -> Path:
    return run_dir / f"admin-{index}.sock"


@dataclass(frozen=True)
class WorkerRole:
    """Which worker a router process is, where its siblings meet, and the public port they
    share. `arguments` and `from_arguments` are how the parent hands it over."""

    index: int
    count: int
    run_dir: Path
    port: int

    @property
    def board_path(self) -> Path:
        return board_path(self.run_dir)

    @property
    def admin_socket(self) -> Path:
        return admin_socket(self.run_dir, self.index)

    def arguments(self) -> list[str]:
        return [
            "--worker", f"{self.index}/{self.count}", "--run-dir", str(self.run_dir),
            "--port", str(self.port),
        ]  # fmt: skip

    @classmethod
    def from_arguments(cls, worker: str, run_dir: str, port: int) -> WorkerRole:
        index, count = (int(n) for n in worker.split("/"))
        return cls(index, count, Path(run_dir), port)


def resolve_count(count: int | str) -> int:
    """`auto`: one worker per core this process may run on (taskset and cgroups shrink it)."""
    if count == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    return int(count)


def die_with_parent() -> None:
    """A worker whose parent dies (even by SIGKILL) gets SIGTERM and drains, instead of
    serving on unsupervised (Linux's PR_SET_PDEATHSIG; elsewhere nothing happens)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) the public port with SO_REUSEPORT, so that port 0 becomes one
    number every worker then binds too, and nothing else takes it meanwhile; with
    SO_REUSEADDR, as every server binds, so a port whose last connections are in TIME_WAIT
    (a restart) is not refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class Supervisor:
    def __init__(self, config_path: str, config: RouterConfig, count: int) -> None:
        self.config_path, self.config, self.count = config_path, config, count
        self.admin_tls = server_context(config.admin_listen.tls, "admin_listen.tls")
        self.run_dir = Path(tempfile.mkdtemp(prefix="gpuroute-router-"))  # mode 0700
        self.procs: list[asyncio.subprocess.Process | None] = [None] * count
        self.restarts = [0] * count
        self.stopping = asyncio.Event()
        self.started = False  # every worker answered once: the parent's /readyz may say so
        self.port = 0

    def command(self, index: int) -> list[str]:
        role = WorkerRole(index, self.count, self.run_dir, self.port)
        return [
            sys.executable, "-m", "gpuroute.cli", "router", "--config", self.config_path,
            *role.arguments(),
        ]  # fmt: skip

    async def spawn(self, index: int) -> asyncio.subprocess.Process:
        admin_socket(self.run_dir, index).unlink(missing_ok=True)
        proc = await asyncio.create_subprocess_exec(*self.command(index))
        self.procs[index] = proc
        return proc

    async def wait_started(self, index: int, admin: WorkerAdmin) -> None:
        """Until the worker's admin socket answers; StartupFailed if it exits first."""
        proc, deadline = self.procs[index], time.monotonic() + START_TIMEOUT_S
        assert proc is not None
        while await admin.ask(admin_socket(self.run_dir, index), "/healthz") is None:
            if proc.returncode is not None:
                raise StartupFailed(index, proc.returncode)
            if time.monotonic() > deadline:
                raise StartupFailed(index, None)
            with contextlib.suppress(TimeoutError):  # a poll period, woken early by an exit
                await asyncio.wait_for(proc.wait(), 0.1)

    def status(self) -> list:
        up = sum(p is not None and p.returncode is None for p in self.procs)
        return worker_families(up, self.restarts)

    def unready(self) -> str | None:
        if self.stopping.is_set():
            return "draining"
        return None if self.started else "starting"

    async def keep(self, index: int) -> None:
        """Restart a worker that dies while the router is not stopping, with backoff."""
        while not self.stopping.is_set():
            proc = self.procs[index]
            assert proc is not None
            code = await proc.wait()
            if self.stopping.is_set():
                return
            delay = RESTART_BACKOFF_S[min(self.restarts[index], len(RESTART_BACKOFF_S) - 1)]
            log.error("worker %d exited with %s; restarting in %.0f s", index, code, delay)
            self.restarts[index] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
            if not self.stopping.is_set():
                await self.spawn(index)

    async def stop_workers(self) -> None:
        """SIGTERM to all at once (each drains its streams), SIGKILL after the drain time."""
        running = [p for p in self.procs if p is not None and p.returncode is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        grace = self.config.drain_timeout_s + 15
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), grace)
        except TimeoutError:
            for proc in running:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await asyncio.gather(*(p.wait() for p in running))

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        listen = self.config.listen
        admin = WorkerAdmin(
            lambda: [admin_socket(self.run_dir, i) for i in range(self.count)],
            self.status,
            self.unready,
        )
        hups: set[asyncio.Task] = set()  # SIGHUP: every worker reloads
        loop.add_signal_handler(
            signal.SIGHUP, lambda: hups.add(loop.create_task(admin.reload_all()))
        )
        guarded = admin.app(admin_guards(self.config, "router"))
        runner = web.AppRunner(guarded, access_log=None, shutdown_timeout=CUT_GRACE_S)
        try:
            reservation = reserve_port(listen.host, listen.port)  # OSError: a clear exit 1
        except OSError:
            self.run_dir.rmdir()
            raise
        try:
            self.port = reservation.getsockname()[1]
            create_board(board_path(self.run_dir), self.count)
            await runner.setup()  # first: its /readyz says which workers are not up yet
            a = self.config.admin_listen
            await web.TCPSite(runner, a.host, a.port, ssl_context=self.admin_tls).start()
            for index in range(self.count):
                await self.spawn(index)
            await asyncio.gather(*(self.wait_started(i, admin) for i in range(self.count)))
            self.started = True
            reservation.close()
            url = listen.url(self.port)
            log.info("gpuroute router listening on %s (%d workers)", url, self.count,
                     extra={"url": url, "workers": self.count})  # fmt: skip
            keepers = [asyncio.create_task(self.keep(i)) for i in range(self.count)]
            await self.stopping.wait()
            log.info("signal received: every worker drains")
            await self.stop_workers()
            await asyncio.gather(*keepers)
            return 0
        except StartupFailed as exc:
            print(f"gpuroute router: error: {exc}", file=sys.stderr)
            self.stopping.set()
            await self.stop_workers()
            return 1
        finally:
            reservation.close()
            await runner.cleanup()
            for path in self.run_dir.iterdir():
                path.unlink(missing_ok=True)
            self.run_dir.rmdir()


class StartupFailed(Exception):
    def __init__(self, index: int, code: int | None) -> None:
        why = "did not start in time" if code is None else f"exited with {code} while starting"
        super().__init__(f"worker {index} {why} (its log is above)")
