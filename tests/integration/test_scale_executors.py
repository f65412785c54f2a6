"""`gpuroute scale` with its production executors, on loopback: routers' `/admin/autoscale`
(scripted servers that demand the admin token) read, the most any router asks per pool
handed to a real command (JSON on stdin) or a webhook (JSON POSTed with its token), only
when a size changed, again after a failure; bad input refused with exit status 2."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys

import aiohttp
import pytest
from aiohttp import web
from gpuroute.router.core.scale_targets import PoolTarget
from gpuroute.router.scaling.executors import CommandExecutor, WebhookExecutor
from gpuroute.router.scaling.scaler import ExecutorFailed, RouterAdmin, Scaler
from support.live import gpuroute_cmd

pytestmark = pytest.mark.asyncio
TOKEN = "admin-token-for-scale-tests"


def sizes(**pools: tuple[int, int]) -> dict:
    return {
        "interval_s": 0.2,
        "pools": {
            p: {"desired_backends": a, "desired_standby_backends": s, "in_rotation": a,
                "standby": s, "rate_rps": 0.0, "forecast_rps": 0.0, "utilisation": 0.0,
                "capacity_rps": 1.0, "reason": "steady"}
            for p, (a, s) in pools.items()
        },
    }  # fmt: skip


@contextlib.asynccontextmanager
async def serving(routes: list[tuple[str, str, object]]):
    """An in-process aiohttp server on a free loopback port; yields its URL."""
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def router_admin(state: dict):
    """A router's admin listener as far as the scaler sees it: its answer in state["answer"]."""

    async def autoscale(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": {"message": "admin token required"}}, status=401)
        return web.json_response(state["answer"])

    return serving([("GET", "/admin/autoscale", autoscale)])


HOOK = """import pathlib, sys
calls, rc = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[1] + ".rc")
with calls.open("a") as out:
    out.write(sys.stdin.read() + "\\n")
sys.exit(int(rc.read_text()) if rc.exists() else 0)
"""


def recorder(path) -> list[str]:
    """A command that appends its stdin to `path`, then exits with the status in `path`.rc."""
    script = path.with_suffix(".py")
    script.write_text(HOOK)
    return [sys.executable, str(script), str(path)]


def calls(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_the_most_any_router_asks_goes_to_the_command_on_changes_only(tmp_path) -> None:
    a, b = {"answer": sizes(m=(2, 1))}, {"answer": sizes(m=(3, 0), n=(1, 1))}
    out = tmp_path / "calls.jsonl"
    async with router_admin(a) as url_a, router_admin(b) as url_b:
        routers = [RouterAdmin(url_a, TOKEN), RouterAdmin(url_b, TOKEN)]
        scaler = Scaler(routers, CommandExecutor(recorder(out), timeout_s=20))
        async with aiohttp.ClientSession() as session:
            assert await scaler.round(session)
            assert await scaler.round(session)  # nothing changed: no call
            b["answer"] = sizes(m=(1, 0), n=(1, 1))
            assert await scaler.round(session)
            (tmp_path / "calls.jsonl.rc").write_text("3")
            a["answer"] = sizes(m=(4, 1))
            assert not await scaler.round(session)  # the command failed ...
            (tmp_path / "calls.jsonl.rc").write_text("0")
            assert await scaler.round(session)  # ... and is called again
            assert await scaler.round(session)
        assert scaler.interval_s == 0.2  # the routers' own interval
    m = {"desired_backends": 3, "desired_standby_backends": 1}
    one = {"desired_backends": 1, "desired_standby_backends": 1}
    assert calls(out) == [
        {"pools": {"m": m, "n": one}},
        {"pools": {"m": {"desired_backends": 2, "desired_standby_backends": 1}, "n": one}},
        {"pools": {"m": {"desired_backends": 4, "desired_standby_backends": 1}, "n": one}},
        {"pools": {"m": {"desired_backends": 4, "desired_standby_backends": 1}, "n": one}},
    ]
    assert scaler.calls == 4


async def test_a_webhook_gets_the_sizes_with_its_token_and_is_retried_after_an_error() -> None:
    got: list[tuple[str | None, dict]] = []
    status = {"code": 500}

    async def hook(request: web.Request) -> web.Response:
        got.append((request.headers.get("Authorization"), await request.json()))
        return web.Response(status=status["code"], text="busy")

    router = {"answer": sizes(m=(2, 1))}
    async with router_admin(router) as admin, serving([("POST", "/scale", hook)]) as hooks:
        webhook = WebhookExecutor(hooks + "/scale", token="hook-token", timeout_s=5)
        scaler = Scaler([RouterAdmin(admin, TOKEN)], webhook, interval_s=0.05)
        async with aiohttp.ClientSession() as session:
            assert not await scaler.round(session)  # 500: not taken
            status["code"] = 204
            assert await scaler.round(session)
            assert await scaler.round(session)  # taken, unchanged: no call
        await webhook.close()
    body = {"pools": {"m": {"desired_backends": 2, "desired_standby_backends": 1}}}
    assert got == [("Bearer hook-token", body), ("Bearer hook-token", body)]
    with pytest.raises(ExecutorFailed, match="/gone"):  # nobody listens there any more
        await WebhookExecutor(hooks + "/gone", timeout_s=2).apply({"m": PoolTarget(1, 0)})


async def test_a_command_past_its_deadline_is_killed_and_reported() -> None:
    slow = CommandExecutor([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    with pytest.raises(ExecutorFailed, match=r"ran past 0\.5 s; killed"):
        await slow.apply({"m": PoolTarget(1, 0)})
    with pytest.raises(ExecutorFailed, match="cannot run"):
        await CommandExecutor(["/nonexistent/scale-hook"]).apply({})


async def run_scale(*args: str, env: dict | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *gpuroute_cmd("scale", *args, "--log-format", "text"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode()


async def test_scale_once_through_the_cli_with_the_admin_token_from_a_file(tmp_path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    out = tmp_path / "calls.jsonl"
    command = shlex.join(recorder(out))
    async with router_admin({"answer": sizes(m=(2, 1))}) as admin:
        rc, text = await run_scale("--router", admin, "--admin-token-file", str(token_file),
                                   "--command", command, "--once")  # fmt: skip
        assert rc == 0, text
        assert calls(out) == [
            {"pools": {"m": {"desired_backends": 2, "desired_standby_backends": 1}}}
        ]
        rc, text = await run_scale("--router", admin, "--command", "true", "--once")
        assert rc == 1 and "status 401" in text, text  # no token: the router refuses


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--router", "ftp://x", "--command", "true"], "--router: 'ftp://x' is not an http(s) URL"),
        (["--router", "http://127.0.0.1:1", "--webhook", "http://example.com/h"],
         "--webhook: http://example.com/h is plain http off loopback"),
        (["--router", "http://10.0.0.1:9090", "--admin-token-file", "TOKEN", "--command", "true"],
         "would carry the admin token in clear"),
        (["--router", "http://127.0.0.1:1", "--command", ""], "--command: empty"),
        (["--router", "http://127.0.0.1:1", "--local"], "--local needs --consul URL"),
        (["--router", "http://127.0.0.1:1", "--command", "true", "--interval", "0"],
         "--interval: must be > 0"),
        (["--router", "http://127.0.0.1:1", "--command", "true", "--admin-token-file", "/nope"],
         "--admin-token-file: cannot read /nope"),
        (["--router", "http://127.0.0.1:1"], "one of the arguments --command --webhook --local"),
    ],
)  # fmt: skip
async def test_bad_input_is_refused_with_status_2(tmp_path, args: list[str], says: str) -> None:
    (tmp_path / "TOKEN").write_text(TOKEN)
    args = [str(tmp_path / "TOKEN") if a == "TOKEN" else a for a in args]
    rc, text = await run_scale(*args)
    assert rc == 2 and says in text, text
