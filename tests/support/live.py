"""Helpers for loopback integration tests: free ports, real processes, condition waits."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port, free_ports  # noqa: F401 - re-exported

from support.redis_server import SHARED_STATE_TIMEOUT_S

MODEL = "llama-3.1-8b"


def gpuroute_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuroute.cli", *args]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `condition` until it holds; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


async def async_wait_for(
    condition: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Await `condition` until it holds; fail with `what` after `timeout` seconds, counting
    the checks themselves (one that hangs is cancelled at the deadline)."""
    limit = asyncio.timeout(timeout)
    try:
        async with limit:
            while not await condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        if not limit.expired():
            raise  # the check's own timeout, not ours
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A plain condition as the async one `async_wait_for` polls."""

    async def check() -> bool:
        return predicate()

    return check


def get_json(url: str):
    """GET a JSON document; None when the server cannot be reached."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


def stopped(process: subprocess.Popen, log: Path, timeout: float = 60.0) -> int:
    """SIGTERM, then its exit status; one that does not exit in `timeout` is killed and the
    failure shows its log's tail (which step of its shutdown it was in)."""
    process.terminate()
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        tail = log.read_text(errors="replace").splitlines()[-20:]
        shown = "\n".join(tail)
        raise AssertionError(f"not stopped {timeout} s after SIGTERM; its log:\n{shown}") from None


def http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


class FakeEngineProcess:
    """`gpuroute fake-engine` as a child process on a free loopback port."""

    def __init__(
        self,
        gpu: str = "H100",
        *,
        time_scale: float = 1.0,
        extra: tuple[str, ...] = (),
        port: int | None = None,
    ):
        self.gpu = gpu
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = gpuroute_cmd(
            "fake-engine",
            "--gpu",
            gpu,
            "--port",
            str(self.port),
            "--time-scale",
            str(time_scale),
            *extra,
        )
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for(
            lambda: self.proc.poll() is not None or http_ok(self.url + "/health"),
            20,
            f"{gpu} engine",
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"fake engine exited: {self.proc.stderr.read().decode()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stderr:
            self.proc.stderr.close()


@contextlib.contextmanager
def fake_engines(*specs: tuple[str, float]) -> Iterator[list[FakeEngineProcess]]:
    engines: list[FakeEngineProcess] = []
    try:
        for gpu, scale in specs:
            engines.append(FakeEngineProcess(gpu, time_scale=scale))
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def router_toml(
    backends: list[tuple[str, str]],
    port: int = 0,
    *,
    model: str = MODEL,
    policy: str | None = None,
    **sections: str,
) -> str:
    """A router config: backends as (url, gpu) serving `model`; the default policy unless
    `policy`; extra TOML per section name."""
    top = ROUTER_ON_LOOPBACK + "tick_s = 0.05" + (f'\npolicy = "{policy}"' if policy else "")
    lines = [top, f"[listen]\nport = {port}"]
    for name, body in sections.items():
        lines.append(f"[{name}]\n{body}")
    for url, gpu in backends:
        lines.append(f'[[backends]]\nurl = "{url}"\ngpu = "{gpu}"\nmodels = ["{model}"]')
    return "\n".join(lines) + "\n"


def shared_redis(url: str, extra: str = "") -> str:
    """A `[redis]` section body for a test of what replicas share (a generous per-call
    timeout: support.redis_server.SHARED_STATE_TIMEOUT_S says why)."""
    return f'url = "{url}"\ntimeout_s = {SHARED_STATE_TIMEOUT_S}\n{extra}'


def membership_toml(consul: str) -> str:
    """A router that finds its engines through the Consul agent at `consul` (and their
    agents' load streams)."""
    return (
        ROUTER_ON_LOOPBACK + "tick_s = 0.05\n[listen]\nport = 0\n"
        f'[membership]\nconsul = "{consul}"\nwait_s = 5\n'
    )


def counter(app, name: str, **labels: str) -> float:
    """A counter of a router's or global tier's (`app.metrics`) registry: `name` without
    its `_total`; 0 where the labels were never counted."""
    return app.metrics.registry.get_sample_value(name + "_total", labels) or 0.0


@contextlib.contextmanager
def spans_to(server, exporter) -> Iterator:
    """A started tier's spans (`server.runner`, its [tracing] set) sent to `exporter`
    instead of its collector, flushed at the end; yields its tracing (to wrap the tracer)."""
    from gpuroute.tracing import TRACING

    tracing = server.runner.app[TRACING]
    tracing.stop()
    tracing.start(exporter=exporter)
    try:
        yield tracing
    finally:
        tracing.provider.force_flush()


def chat_body(text: str = "hello", *, stream: bool = False, max_tokens: int | None = 8) -> dict:
    body: dict = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def stream_error(body: bytes, relayed: bytes = b"") -> dict:
    """The OpenAI error a broken stream ends with: `body` is `relayed`, then exactly one
    `data:` event holding the error, then `data: [DONE]` (asserted)."""
    assert body.startswith(relayed), body[:200]
    event, done, end = body.removeprefix(relayed).split(b"\n\n")
    assert (event[:6], done, end) == (b"data: ", b"data: [DONE]", b""), body[-300:]
    return json.loads(event.removeprefix(b"data: "))["error"]


# how a stream that broke after its first bytes ends (message aside: it says what broke)
STREAM_BROKE = {"type": "upstream_error", "param": None, "code": "upstream_stream_error"}


async def backends_state(session: aiohttp.ClientSession, router_url: str) -> dict[str, dict]:
    async with session.get(router_url + "/admin/backends") as response:
        return {row["id"]: row for row in (await response.json())["backends"]}


def environ_without_proxies() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


@contextlib.asynccontextmanager
async def running_router(config_text: str, tmp_dir, *, seed: int = 0, rng=None):
    """An in-process router on a free loopback port; yields (url, RouterApp)."""
    async with router_server(config_text, tmp_dir, seed=seed, rng=rng) as server:
        yield f"http://127.0.0.1:{server.port}", server.servable


@contextlib.asynccontextmanager
async def router_server(config_text: str, tmp_dir, *, seed: int = 0, rng=None):
    """An in-process RouterServer, started (its .port, .admin_port and .servable); its
    placement draws from `rng` (a random.Random), else from one seeded with `seed`."""
    import random

    from gpuroute.router.config.router import load_router_config
    from gpuroute.router.http.server import RouterApp
    from gpuroute.router.process import RouterServer

    path = tmp_dir / "router.toml"
    path.write_text(config_text)
    server = RouterServer(RouterApp(load_router_config(path), rng=rng or random.Random(seed)))
    await server.start()
    try:
        yield server
    finally:
        await server.drain(timeout=2.0)


@contextlib.asynccontextmanager
async def router_replicas(config_text: str, tmp_dir, count: int = 2):
    """`count` in-process RouterServers of one config (replicas), each with its own folder
    under `tmp_dir`; yields them, started."""
    async with contextlib.AsyncExitStack() as stack:
        servers = []
        for i in range(count):
            folder = tmp_dir / f"replica-{i}"
            folder.mkdir()
            servers.append(await stack.enter_async_context(router_server(config_text, folder)))
        yield servers


async def healthy(_request) -> object:
    from aiohttp import web

    return web.Response()


@contextlib.asynccontextmanager
async def scripted_backend(handler):
    """An in-process aiohttp server whose every POST is answered by `handler`."""
    from aiohttp import web

    app = web.Application()
    # a callable object's bound __call__ is the coroutine function aiohttp wants
    coroutine = handler if inspect.iscoroutinefunction(handler) else handler.__call__
    app.router.add_get("/health", healthy)  # as an engine answers the router's checks
    app.router.add_route("*", "/{tail:.*}", coroutine)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def agent_toml(
    engine,
    consul: str,
    agent_id: str,
    *,
    model: str = MODEL,
    gpu: str | None = None,
    telemetry: str = "simulated",
    **overrides: str,
) -> str:
    """A node agent's config for `engine` (its `url`; its `gpu` unless given), registering
    with the Consul agent at `consul`; `overrides` are top-level keys as TOML values."""
    top = {
        "id": f'"{agent_id}"',
        "drain_grace_s": overrides.pop("drain_grace_s", "0.5"),
        "drain_timeout_s": overrides.pop("drain_timeout_s", "30"),
        **overrides,
    }
    lines = [f"{k} = {v}" for k, v in top.items()]
    lines += [
        f'[engine]\nurl = "{engine.url}"\nmodels = ["{model}"]\ngpu = "{gpu or engine.gpu}"',
        f'[telemetry]\nsource = "{telemetry}"\nhealth_interval_s = 0.2\ninterval_s = 0.1',
        f'[consul]\naddress = "{consul}"\nttl_s = 6',
        f"[load_stream]\nport = {free_port()}",
        f"[admin]\nport = {free_port()}",
    ]
    return "\n".join(lines) + "\n"


class AgentProcess:
    """`gpuroute agent --config` as a child process."""

    def __init__(self, config_text: str, tmp_dir, name: str) -> None:
        self.path = tmp_dir / f"{name}.toml"
        self.path.write_text(config_text)
        self.log = (tmp_dir / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(
            gpuroute_cmd("agent", "--config", str(self.path)),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def drain(self, action: str = "drain") -> subprocess.CompletedProcess:
        """`gpuroute agent drain` (or `undrain`, `standby`, `activate`) against this agent."""
        return subprocess.run(
            gpuroute_cmd("agent", action, "--config", str(self.path)),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()
