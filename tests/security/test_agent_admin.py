"""The agent's admin (issue 16 item 12): `POST /drain` answered anyone and took the host out
for good (the process exited 0 under Restart=on-failure)."""

from __future__ import annotations

import aiohttp
import pytest
from gpuroute.agent.config import AgentConfig, load_agent_config
from gpuroute.agent.server import Agent
from support.live import FakeEngineProcess, async_wait_for

pytestmark = pytest.mark.asyncio
TOKEN = "agent-admin-secret"


def agent_config(tmp_path, engine: FakeEngineProcess, token_line: str) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(
        f"{token_line}\ndrain_grace_s = 0\ndrain_timeout_s = 5\n"
        f'[engine]\nurl = "{engine.url}"\nmodels = ["llama-3.1-8b"]\ngpu = "H100"\n'
        '[telemetry]\nsource = "simulated"\nhealth_interval_s = 0.1\ninterval_s = 0.1\n'
        "[consul]\nenabled = false\n[load_stream]\nport = 0\n[admin]\nport = 0\n"
    )
    return load_agent_config(path)


async def test_drain_needs_the_token_and_undrain_brings_the_host_back(tmp_path) -> None:
    engine = FakeEngineProcess("H100")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    agent = Agent(agent_config(tmp_path, engine, f'admin_token_file = "{token_file}"'))
    await agent.start()
    admin = f"http://127.0.0.1:{agent.admin_port}"
    try:
        async with aiohttp.ClientSession() as s:

            async def health() -> str:
                async with s.get(admin + "/status") as r:
                    return (await r.json())["health"]

            async def passing() -> bool:
                return await health() == "passing"

            await async_wait_for(passing, 10, "agent passing")
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                async with s.post(admin + "/drain", headers=headers) as r:
                    assert r.status == 401, headers
            assert await health() == "passing"
            good = {"Authorization": f"Bearer {TOKEN}"}
            async with s.post(admin + "/drain", headers=good) as r:
                assert r.status == 200 and (await r.json())["drained"] is True
            assert await health() == "draining" and not agent.done.is_set()
            async with s.post(admin + "/undrain") as r:
                assert r.status == 401
            async with s.post(admin + "/undrain", headers=good) as r:
                assert r.status == 200 and (await r.json())["undrained"] is True
            await async_wait_for(passing, 10, "agent passing again")
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
