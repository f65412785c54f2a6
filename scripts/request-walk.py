#!/usr/bin/env python3
"""Count the walk of one streamed chat request through the router's code (issue 44).

A real router (RouterApp, built from config as the process builds it) and a fake engine
run in this process on loopback. After one warm-up request, ONE streamed chat request is
sent on a fresh connection and every Python call and return made for it is recorded with
sys.setprofile, keeping only frames whose code is gpuroute's (its test bed, the fake engine,
left out) and only those run by the tasks the request started or by no task (the sockets'
callbacks): the router's own background tasks, which existed before it, are left out.

It prints the distinct modules and functions the request crossed, and its walk: the
sequence of modules holding control (a module calling its own functions stays one step),
with each return to a module already left. The same command measures any tree: run it
with that tree's interpreter, e.g.

    /work/wt/base/.venv/bin/python scripts/request-walk.py      # before
    .venv/bin/python scripts/request-walk.py                     # after

`--json` prints the figures as JSON; `--walk` prints the walk itself."""

from __future__ import annotations

import argparse
import asyncio
import dis
import inspect
import json
import logging
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

MODEL = "llama-3.1-8b"
LEFT_OUT = ("gpuroute.testbed", "gpuroute.bench", "gpuroute.sim")
RESUMABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
YIELD_VALUE = dis.opmap["YIELD_VALUE"]


def module_of(frame) -> str | None:
    """The gpuroute module a frame's code belongs to (None: not ours, or the test bed's)."""
    name = frame.f_globals.get("__name__", "")
    if not name.startswith("gpuroute") or name.startswith(LEFT_OUT):
        return None
    return name


class Walk:
    """The calls and returns of one request's tasks, as modules and functions. A coroutine
    suspended at an await and resumed later has not returned: its suspensions are skipped,
    so the walk is the request's logical one, not the event loop's interleaving."""

    def __init__(self, background: set[asyncio.Task]) -> None:
        self.background = background  # tasks that existed before the request
        self.functions: set[tuple[str, str]] = set()
        self.walks: dict[asyncio.Task, list[str]] = {}  # per task, consecutive repeats merged
        self.callbacks: Counter[tuple[str, str]] = Counter()  # (from, into) its caller
        self.started: dict[int, object] = {}  # coroutine frames running (kept: ids stay theirs)

    def profile(self, frame, event: str, _arg) -> None:
        if event not in ("call", "return"):
            return
        task = asyncio.current_task()
        if task in self.background:
            return
        resumable = frame.f_code.co_flags & RESUMABLE
        if event == "call":
            if resumable:
                if id(frame) in self.started:
                    return  # resumed after an await: not a call
                self.started[id(frame)] = frame
            module = module_of(frame)
            if module is not None:
                self.functions.add((module, frame.f_code.co_qualname))
                self.step(task, module)
                self.called_back(frame, module)
            return
        if resumable:
            if frame.f_code.co_code[frame.f_lasti] == YIELD_VALUE:
                return  # suspended at an await
            self.started.pop(id(frame), None)
        caller = frame.f_back  # a return hands control back to the caller, if it is ours
        while caller is not None and module_of(caller) is None:
            caller = caller.f_back
        if caller is not None:
            self.step(task, module_of(caller))

    def called_back(self, frame, module: str) -> None:
        """A call into a module that is still on the stack under another one: a cycle."""
        callers = []
        caller = frame.f_back
        while caller is not None:
            if (name := module_of(caller)) is not None:
                callers.append(name)
            caller = caller.f_back
        if callers and callers[0] != module and module in callers:
            self.callbacks[(callers[0], module)] += 1

    def step(self, task: asyncio.Task | None, module: str) -> None:
        if task is None:
            return  # a socket's callback: its functions count, it is no step of the walk
        steps = self.walks.setdefault(task, [])
        if not steps or steps[-1] != module:
            steps.append(module)

    @property
    def steps(self) -> list[str]:
        return [step for steps in self.walks.values() for step in steps]

    def returns(self) -> Counter[str]:
        """Each module's returns: control back in it after it had passed elsewhere."""
        counted: Counter[str] = Counter()
        for steps in self.walks.values():
            counted.update(steps)
            counted.subtract(set(steps))
        return Counter({m: n for m, n in counted.items() if n > 0})

    def figures(self) -> dict:
        returns = self.returns()
        return {
            "modules": len({m for m, _ in self.functions}),
            "functions": len(self.functions),
            "tasks": len(self.walks),
            "steps": len(self.steps),
            "returns": sum(returns.values()),
            "modules_returned_to": len(returns),
            "returns_by_module": dict(returns.most_common()),
            "callbacks": sum(self.callbacks.values()),
            "callbacks_by_pair": {f"{a} -> {b}": n for (a, b), n in self.callbacks.most_common()},
        }


def router_toml(engine_urls: list[str]) -> str:
    backends = "".join(
        f'[[backends]]\nurl = "{url}"\ngpu = "H100"\nmodels = ["{MODEL}"]\n' for url in engine_urls
    )
    return (
        "admin_on_public_listener = true\nexpose_backend_header = true\ntick_s = 60\n"
        "[auth]\nallow_anonymous = true\n" + backends
    )


async def one_chat(url: str) -> bytes:
    """A streamed chat on its own connection; its whole body."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": True,
        "max_tokens": 8,
    }
    async with (
        aiohttp.ClientSession() as session,  # a fresh connection: a fresh task
        session.post(url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200, (response.status, await response.text())
        return await response.read()


def event(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    chunk = {"id": "cmpl-w", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
             "choices": [choice]}  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def dying_then_healthy(request: web.Request) -> web.StreamResponse:
    """An engine whose first stream of a chat dies after three tokens; the continuation (the
    assistant's turn continued) streams two more and its finish."""
    body = await request.json()
    continuing = bool(body.get("continue_final_message"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(event({"role": "assistant", "content": ""}))
    for piece in (" b1", " b2") if continuing else (" a1", " a2", " a3"):
        await response.write(event({"content": piece}))
    if not continuing:
        assert request.transport is not None
        request.transport.abort()  # the engine dies with the answer half sent
        return response
    await response.write(event({}, "stop") + b"data: [DONE]\n\n")
    return response


class EngineThread:
    """The engines on loopback ports, served by an event loop of their own in another
    thread: the profile (per thread) sees none of their calls. Three engines whose first
    streams die (`broken`: a break opens its engine's breaker), else one fake engine."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runners: list[web.AppRunner] = []
        self.urls: list[str] = []

    def __enter__(self) -> EngineThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        try:  # the layout of issue 44, or the one before it (the "before" of a comparison)
            from gpuroute.testbed.fake_engine.server import FakeEngine, FakeEngineConfig
        except ImportError:
            from gpuroute.testbed.fake_engine import FakeEngine, FakeEngineConfig

        if self.broken:
            apps = []
            for _ in range(3):  # one broken by the warm-up, one by the request, one goes on
                app = web.Application()
                app.router.add_post("/v1/chat/completions", dying_then_healthy)
                apps.append(app)
        else:
            apps = [FakeEngine(FakeEngineConfig(gpu="H100", time_scale=0.001)).app()]
        for app in apps:
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.runners.append(runner)
            self.urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")

    def __exit__(self, *_exc) -> None:
        for runner in self.runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


async def measure(folder: Path, engine_urls: list[str]) -> Walk:
    try:  # the layout of issue 44, or the one before it (the "before" of a comparison)
        from gpuroute.router.config.router import load_router_config
        from gpuroute.router.http.server import RouterApp
    except ImportError:
        from gpuroute.router.config import load_router_config
        from gpuroute.router.server import RouterApp

    path = folder / "router.toml"
    path.write_text(router_toml(engine_urls))
    router = RouterApp(load_router_config(path))
    async with TestServer(router.app()) as router_server:
        url = str(router_server.make_url("")).rstrip("/")
        await one_chat(url)  # warm: pools opened, lazy imports done
        walk = Walk(asyncio.all_tasks())
        sys.setprofile(walk.profile)
        try:
            answer = await one_chat(url)
        finally:
            sys.setprofile(None)
        assert answer.rstrip().endswith(b"data: [DONE]"), answer[-200:]
    return walk


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.add_argument("--walk", action="store_true", help="print the walk, step by step")
    parser.add_argument(
        "--broken",
        action="store_true",
        help="its engine dies mid-stream and the stream goes on on another (a continuation)",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # a broken stream's warnings: the walk is the output
    with tempfile.TemporaryDirectory() as folder, EngineThread(args.broken) as engines:
        walk = asyncio.run(measure(Path(folder), engines.urls))
    figures = walk.figures()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    if args.walk:
        print("\n".join(walk.steps))
    print(f"modules crossed:   {figures['modules']}")
    print(f"functions called:  {figures['functions']}")
    print(f"walk steps:        {figures['steps']}")
    print(
        f"returns to a module already left: {figures['returns']} "
        f"(to {figures['modules_returned_to']} modules)"
    )
    for module, n in figures["returns_by_module"].items():
        print(f"  {n:4d}  {module}")
    print(f"calls back into a module still on the stack under another: {figures['callbacks']}")
    for pair, n in figures["callbacks_by_pair"].items():
        print(f"  {n:4d}  {pair}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
