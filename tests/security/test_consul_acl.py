"""Consul with ACLs on and default deny (issue 16 items 13 and 18): each role holds its own
token with the least rights; the agent reads its token from a file, the router from an
environment variable it names, CONSUL_HTTP_TOKEN cannot replace them, and an agent without
a token cannot register an engine."""

from __future__ import annotations

import json
import urllib.request
import uuid

import aiohttp
import pytest
from gpuroute.testbed.consul_dev import ConsulDev
from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK
from support import components
from support.live import (
    AgentProcess,
    FakeEngineProcess,
    agent_toml,
    async_wait_for,
    backends_state,
    running_router,
    wait_for,
)

pytestmark = pytest.mark.asyncio
AGENT_RULES = 'service "gpuroute-engine" { policy = "write" }'
ROUTER_RULES = (
    'node_prefix "" { policy = "read" }\nservice "gpuroute-engine" { policy = "read" }\n'
    'service "gpuroute-router" { policy = "write" }'
)


def registered(consul: ConsulDev) -> list[str]:
    request = consul.request("/v1/catalog/service/gpuroute-engine")
    with urllib.request.urlopen(request, timeout=5) as response:
        return [entry["ServiceID"] for entry in json.load(response)]


async def test_each_role_with_its_own_token_and_no_way_in_without_one(
    tmp_path, monkeypatch
) -> None:
    binary = components.consul()
    with ConsulDev(binary, log_path=tmp_path / "consul.log", acl_token=str(uuid.uuid4())) as consul:
        agent_token, router_token = (
            consul.create_token("gpuroute-agent", AGENT_RULES),
            consul.create_token("gpuroute-router", ROUTER_RULES),
        )
        (tmp_path / "agent-token").write_text(agent_token + "\n")
        engines = [FakeEngineProcess("H100"), FakeEngineProcess("L4")]
        agents = []
        try:
            with_token = agent_toml(engines[0], consul.address, "acl-ok").replace(
                "ttl_s = 6", f'ttl_s = 6\ntoken_file = "{tmp_path / "agent-token"}"'
            )
            agents.append(AgentProcess(with_token, tmp_path, "acl-ok"))
            agents.append(AgentProcess(agent_toml(engines[1], consul.address, "acl-none"),
                                       tmp_path, "acl-none"))  # fmt: skip
            wait_for(lambda: "acl-ok" in registered(consul), 20, "the agent with a token")
            log = tmp_path / "acl-none.log"
            wait_for(lambda: "Consul refused the registration" in log.read_text(), 20,
                     "the tokenless agent refused, and saying so")  # fmt: skip
            assert registered(consul) == ["acl-ok"]

            monkeypatch.setenv("GPUROUTE_ROUTER_TOKEN", router_token)
            monkeypatch.setenv("CONSUL_HTTP_TOKEN", "not-a-token")  # must not win
            config = (
                ROUTER_ON_LOOPBACK + "tick_s = 0.05\n[listen]\nport = 0\n"
                f'[membership]\nconsul = "{consul.address}"\nwait_s = 5\n'
                'token_env = "GPUROUTE_ROUTER_TOKEN"\n'
            )
            async with running_router(config, tmp_path) as (url, _router):
                async with aiohttp.ClientSession() as s:

                    async def discovered() -> bool:
                        return "acl-ok" in await backends_state(s, url)

                    await async_wait_for(discovered, 20, "the router discovers the engine")
                    assert set(await backends_state(s, url)) == {"acl-ok"}
        finally:
            for agent in agents:
                agent.stop()
            for engine in engines:
                engine.stop()
