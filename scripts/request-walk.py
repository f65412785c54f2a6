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


def router_toml(engine_url: str) -> str:
    return (
        "admin_on_public_listener = true\nexpose_backend_header = true\ntick_s = 60\n"
        "[auth]\nallow_anonymous = true\n"
        f'[[backends]]\nurl = "{engine_url}"\ngpu = "H100"\nmodels = ["{MODEL}"]\n'
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


class EngineThread:
    """The fake engine on a loopback port, served by an event loop of its own in another
    thread: the profile (per thread) sees none of its calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    def __enter__(self) -> EngineThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        from gpuroute.testbed.fake_engine import FakeEngine, FakeEngineConfig

        engine = FakeEngine(FakeEngineConfig(gpu="H100", time_scale=0.001))
        self.runner = web.AppRunner(engine.app())
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    def __exit__(self, *_exc) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


async def measure(folder: Path, engine_url: str) -> Walk:
    from gpuroute.router.config import load_router_config
    from gpuroute.router.server import RouterApp

    path = folder / "router.toml"
    path.write_text(router_toml(engine_url))
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, EngineThread() as engine:
        walk = asyncio.run(measure(Path(folder), engine.url))
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
