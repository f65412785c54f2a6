"""The agent's admin (issue 16 item 12): `POST /drain` answered anyone and took the host out
for good (the process exited 0 under Restart=on-failure); and (issue 30 item 13) a web page
could drain a tokenless agent through the host's own browser."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from gpuroute.agent.config import AgentConfig, load_agent_config
from gpuroute.agent.server import Agent
from support.live import FakeEngineProcess, async_wait_for, gpuroute_cmd
from support_admin import page_attacks, unrefused

from gpuroute.admin_guard import AdminToken

pytestmark = pytest.mark.asyncio
TOKEN = "agent-admin-secret"
ACTIONS = ("/drain", "/undrain", "/standby", "/activate")


def agent_config(tmp_path, engine: FakeEngineProcess, token_line: str) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(
        f"{token_line}\ndrain_grace_s = 0\ndrain_timeout_s = 5\n"
        f'[engine]\nurl = "{engine.url}"\nmodels = ["llama-3.1-8b"]\ngpu = "H100"\n'
        '[telemetry]\nsource = "simulated"\nhealth_interval_s = 0.1\ninterval_s = 0.1\n'
        "[consul]\nenabled = false\n[load_stream]\nport = 0\n[admin]\nport = 0\n"
    )
    return load_agent_config(path)


def health_checks(session: aiohttp.ClientSession, admin: str):
    """The agent's health as /status says it, and whether it is passing."""

    async def health() -> str:
        async with session.get(admin + "/status") as r:
            return (await r.json())["health"]

    async def passing() -> bool:
        return await health() == "passing"

    return health, passing


async def test_drain_needs_the_token_and_undrain_brings_the_host_back(tmp_path) -> None:
    engine = FakeEngineProcess("H100")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    agent = Agent(agent_config(tmp_path, engine, f'admin_token_file = "{token_file}"'))
    await agent.start()
    admin = f"http://127.0.0.1:{agent.admin_port}"
    try:
        async with aiohttp.ClientSession() as s:
            health, passing = health_checks(s, admin)

            await async_wait_for(passing, 10, "agent passing")
            for headers, code in (
                ({}, "invalid_admin_token"),
                ({"Authorization": "Bearer wrong"}, "invalid_admin_token"),
                ({"Authorization": "Basic x"}, "invalid_api_key"),  # malformed, as everywhere
            ):
                async with s.post(admin + "/drain", headers=headers, json={}) as r:
                    # the one guard's answer (gpuroute/admin_guard.py), as the router's
                    assert r.status == 401, headers
                    assert (await r.json())["error"]["code"] == code, headers
            assert await health() == "passing"
            good = {"Authorization": f"Bearer {TOKEN}"}
            async with s.post(admin + "/drain", headers=good, json={}) as r:
                assert r.status == 200 and (await r.json())["drained"] is True
            assert await health() == "draining" and not agent.done.is_set()
            async with s.post(admin + "/undrain", json={}) as r:
                assert r.status == 401
            async with s.post(admin + "/undrain", headers=good, json={}) as r:
                assert r.status == 200 and (await r.json())["undrained"] is True
            await async_wait_for(passing, 10, "agent passing again")
            for action in ("/standby", "/activate"):  # out of rotation, or back: as guarded
                async with s.post(admin + action, json={}) as r:
                    assert r.status == 401, action
            assert agent.standby is False
            async with s.post(admin + "/standby", headers=good, json={}) as r:
                assert await r.json() == {"standby": True, "changed": True, "health": "passing"}
            async with s.get(admin + "/status") as r:
                assert (await r.json())["standby"] is True
            async with s.post(admin + "/activate", headers=good, json={}) as r:
                assert await r.json() == {"standby": False, "changed": True, "health": "passing"}
            async with s.post(admin + "/activate", headers=good, json={}) as r:
                assert (await r.json())["changed"] is False
    finally:
        await agent.stop()
        engine.stop()


async def test_a_web_page_cannot_drain_a_tokenless_agent(tmp_path) -> None:
    """Issue 30 item 13: without a token, an agent took `POST /drain` as `text/plain` with a
    foreign `Origin` from loopback: a form on any page the host's browser opened could
    drain it (CSRF), and so could a page whose name was rebound to 127.0.0.1. Issue 42 item
    2: that page could still read `/status` and `/metrics` through the rebound name; the
    refusals now name why, as at the other tiers (one guard: gpuroute/admin_guard.py)."""
    import subprocess

    engine = FakeEngineProcess("H100")
    agent = Agent(agent_config(tmp_path, engine, ""))
    await agent.start()
    admin = f"http://127.0.0.1:{agent.admin_port}"
    try:
        async with aiohttp.ClientSession() as s:
            health, passing = health_checks(s, admin)
            await async_wait_for(passing, 10, "agent passing")
            actions = [("POST", action, b"{}") for action in ACTIONS]
            attacks = page_attacks(agent.admin_port, actions, ["/status", "/metrics"])
            assert await unrefused(admin, attacks) == []  # nor is its status read (rebinding)
            assert await health() == "passing" and agent.standby is False
        cli_config = tmp_path / "agent-cli.toml"  # the port the agent took, for the CLI
        cli_config.write_text(
            (tmp_path / "agent.toml")
            .read_text()
            .replace("[admin]\nport = 0", f"[admin]\nport = {agent.admin_port}")
        )
        drained = await asyncio.to_thread(
            subprocess.run,
            gpuroute_cmd("agent", "drain", "--config", str(cli_config)),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert drained.returncode == 0, drained.stderr  # what the operator runs still works
    finally:
        await agent.stop()
        engine.stop()


async def test_sigterm_after_an_operators_drain_still_ends_the_agent(tmp_path) -> None:
    """An operator's drain leaves the agent running; a SIGTERM afterwards must still drain
    to the end and let the process exit (it used to find the finished drain and do nothing)."""
    import asyncio

    engine = FakeEngineProcess("H100")
    agent = Agent(agent_config(tmp_path, engine, ""))
    await agent.start()
    try:
        result = await asyncio.wait_for(agent.drain(exit_after=False), 10)
        assert result["drained"] is True and not agent.done.is_set()
        agent.drain()  # what SIGTERM calls
        await asyncio.wait_for(agent.done.wait(), 10)
    finally:
        await agent.stop()
        engine.stop()


async def test_an_admin_listener_off_loopback_needs_a_token() -> None:
    with pytest.raises(ValueError, match="is not loopback: set admin_token"):
        AgentConfig.model_validate(
            {
                "engine": {"url": "http://127.0.0.1:8000", "models": ["m"], "gpu": "H100"},
                "admin": {"host": "0.0.0.0", "port": 7071},
            }
        )


async def test_the_agents_admin_token_is_read_by_the_shared_rules() -> None:
    """Issue 44 item 7: the agent takes the admin token's keys and their checks from the
    kernel's one guard (AdminToken, token_off_loopback), not from a copy of its own."""
    engine = {"url": "http://127.0.0.1:8000", "models": ["m"], "gpu": "H100"}
    both = {"engine": engine, "admin_token": "a", "admin_token_env": "B"}
    with pytest.raises(ValueError, match="set only one form of the secret admin_token"):
        AgentConfig.model_validate(both)
    off = {"engine": engine, "admin": {"host": "0.0.0.0", "port": 7071}}
    with pytest.raises(ValueError) as refused:
        AgentConfig.model_validate(off)
    assert (
        "admin.host '0.0.0.0' is not loopback: set admin_token (or admin_token_file, "
        "admin_token_env) to protect drain and undrain" in str(refused.value)
    )
    assert isinstance(AgentConfig.model_validate({**off, "admin_token": "t"}), AdminToken)
