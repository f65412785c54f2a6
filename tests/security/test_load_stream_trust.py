"""A forged Consul entry vouched for by a real agent's load stream (issue 42 finding 3): an
entry registered with Meta `load_port` naming a real agent's stream stayed in the router
after Consul dropped it (30 of 30 requests reached the attacker's engine 10 s later).

A report speaks only for the backend it names (the agent's service ID); a member Consul
deregistered leaves whatever a stream says; with a load-stream token, agents refuse
watchers without the router's proof and routers refuse reports without the agent's."""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.request
from dataclasses import dataclass

import aiohttp
import grpc
import pytest
from gpuroute.agent.load_stream import (
    AgentLoadService,
    LoadBroadcaster,
    LoadSample,
    start_load_server,
)
from gpuroute.router.attempts.exchange import BACKEND_HEADER
from gpuroute.testbed.consul_dev import ConsulDev
from support.live import (
    MODEL,
    AgentProcess,
    FakeEngineProcess,
    agent_toml,
    async_wait_for,
    backends_state,
    chat_body,
    counter,
    fake_engines,
    membership_toml,
    running_router,
    wait_for,
)

from gpuroute.load_auth import NONCE_BYTES, watch_proof
from gpuroute.proto import load_pb2, load_pb2_grpc

pytestmark = pytest.mark.asyncio
TOKEN = "load-stream-token-of-this-fleet"
LEAVE_WITHIN_S = 5.0  # bound on a deregistered entry's stay (Consul's blocking query + a tick)


def load_port_of(consul: ConsulDev, service_id: str) -> int | None:
    with urllib.request.urlopen(consul.request("/v1/agent/services"), timeout=5) as response:
        service = json.load(response).get(service_id)
    return int(service["Meta"]["load_port"]) if service else None


def register_forgery(consul: ConsulDev, engine: FakeEngineProcess, load_port: int) -> None:
    """What a `service:write` token on gpuroute-engine can do: an entry of its own, for its
    own engine, whose Meta names a real agent's load stream, with a check that passes."""
    body = {
        "ID": "rogue",
        "Name": "gpuroute-engine",
        "Address": "127.0.0.1",
        "Port": engine.port,
        "Meta": {"gpu_model": "H100", "models": MODEL, "load_port": str(load_port)},
        "Check": {"CheckID": "rogue-ttl", "TTL": "600s", "Status": "passing"},
    }
    request = consul.request("/v1/agent/service/register", body, "PUT")
    urllib.request.urlopen(request, timeout=5).close()


def deregister(consul: ConsulDev, service_id: str) -> None:
    request = consul.request(f"/v1/agent/service/deregister/{service_id}", {}, "PUT")
    urllib.request.urlopen(request, timeout=5).close()


@dataclass
class Attack:
    consul: ConsulDev
    url: str
    router: object
    session: aiohttp.ClientSession
    rogue_engine: FakeEngineProcess

    async def row(self, backend: str) -> dict | None:
        return (await backends_state(self.session, self.url)).get(backend)

    async def routable(self, backend: str) -> bool:
        row = await self.row(backend)
        return row is not None and row["state"] in ("ready", "warming")

    async def served_by(self, n: int) -> list[str]:
        served = []
        for _ in range(n):
            async with self.session.post(self.url + "/v1/chat/completions",
                                         json=chat_body()) as r:  # fmt: skip
                await r.read()
                served.append(r.headers.get(BACKEND_HEADER, f"status {r.status}"))
        return served


@contextlib.asynccontextmanager
async def forged_entry(consul: ConsulDev, tmp_path, router_extra: str = ""):
    """A real agent ("real") and its engine, a router that found it, and a forged entry
    ("rogue", the attacker's engine) naming the real agent's load stream, in rotation."""
    with fake_engines(("H100", 1.0), ("H100", 1.0)) as (real_engine, rogue_engine):
        agent = AgentProcess(agent_toml(real_engine, consul.address, "real"), tmp_path, "real")
        try:
            wait_for(lambda: load_port_of(consul, "real") is not None, 20, "the real agent")
            config = membership_toml(consul.address) + router_extra
            async with running_router(config, tmp_path) as (url, router):
                async with aiohttp.ClientSession() as session:
                    attack = Attack(consul, url, router, session, rogue_engine)
                    await async_wait_for(lambda: attack.routable("real"), 20, "real routable")
                    register_forgery(consul, rogue_engine, load_port_of(consul, "real"))
                    await async_wait_for(lambda: attack.routable("rogue"), 20, "rogue joined")
                    yield attack
        finally:
            agent.stop()


async def test_a_forged_entry_leaves_when_consul_drops_it_whatever_the_stream_says(
    consul, tmp_path
) -> None:
    async with forged_entry(consul, tmp_path) as attack:
        deregister(consul, "rogue")
        dropped_at = time.monotonic()

        async def gone() -> bool:
            return await attack.row("rogue") is None

        await async_wait_for(gone, LEAVE_WITHIN_S, "the forged entry out of the router")
        left_after = time.monotonic() - dropped_at
        served = await attack.served_by(30)
    print(f"\nforged entry gone {left_after:.2f} s after Consul dropped it; 30 requests: "
          f"{served.count('rogue')} to it, {served.count('real')} to the real engine")  # fmt: skip
    assert served == ["real"] * 30


async def test_a_stream_that_names_another_backend_vouches_for_nothing(consul, tmp_path) -> None:
    async with forged_entry(consul, tmp_path) as attack:
        router = attack.router

        async def settled() -> bool:
            """The forged entry's stream answered: cut, or (before the fix) taken."""
            cut = counter(router, "gpuroute_load_streams_refused", reason="other_backend")
            real, rogue = (await attack.row("real"))["agent"], (await attack.row("rogue"))["agent"]
            return real is not None and real["fresh"] and (cut >= 1 or rogue is not None)

        await async_wait_for(settled, 10, "the forged entry's stream to answer")
        rogue = await attack.row("rogue")
        # no load, health or vouching taken for the forged entry from another agent's stream
        assert rogue["agent"] is None and rogue["external_s"] == 0
        assert not router.membership.verified(router.scheduler.backends.get("rogue"))
        assert router.membership.verified(router.scheduler.backends.get("real"))


def watch(port: int, request: load_pb2.WatchLoadRequest) -> load_pb2.LoadReport:
    """The first report a plain gRPC client gets from the agent's stream on `port`."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = load_pb2_grpc.AgentLoadStub(channel).WatchLoad(request, timeout=5)
        try:
            return next(iter(stream))
        finally:
            stream.cancel()


def signed(token: str, router_id: str = "router") -> load_pb2.WatchLoadRequest:
    nonce, sent_at = os.urandom(NONCE_BYTES), time.time()
    return load_pb2.WatchLoadRequest(
        router_id=router_id, nonce=nonce, sent_at=sent_at,
        router_proof=watch_proof(token, nonce, sent_at, router_id),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def forged_load_server():
    """An attacker's own load server: the agent's code without the token, speaking for
    "rogue" with a host that serves; yields its port."""
    broadcaster = LoadBroadcaster("rogue", time.time)
    await broadcaster.publish(LoadSample(health="passing"))
    service = AgentLoadService(broadcaster, 0.25)
    server, port = await start_load_server(service, "127.0.0.1", 0)
    try:
        yield port
    finally:
        service.closing.set()
        await server.stop(0)


async def test_with_a_token_only_routers_holding_it_watch_and_only_its_agents_report(
    consul, tmp_path, monkeypatch
) -> None:
    (tmp_path / "stream-token").write_text(TOKEN + "\n")
    with fake_engines(("H100", 1.0), ("H100", 1.0)) as (engine, rogue_engine):
        text = agent_toml(engine, consul.address, "tok").replace(
            "[load_stream]\n", f'[load_stream]\ntoken_file = "{tmp_path / "stream-token"}"\n'
        )
        agent = AgentProcess(text, tmp_path, "tok")
        try:
            wait_for(lambda: load_port_of(consul, "tok") is not None, 20, "the agent")
            port = load_port_of(consul, "tok")
            # a subscriber without a proof, or with one under a guessed token, is refused
            for request in (load_pb2.WatchLoadRequest(router_id="anyone"), signed("a guess")):
                with pytest.raises(grpc.RpcError) as refused:
                    watch(port, request)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert watch(port, signed(TOKEN)).backend_id == "tok"  # the control
            await a_router_with_the_wrong_token_is_refused(consul, tmp_path / "wrong")

            monkeypatch.setenv("GPUROUTE_TEST_LOAD_TOKEN", TOKEN)
            config = membership_toml(consul.address)
            config += 'load_stream_token_env = "GPUROUTE_TEST_LOAD_TOKEN"\n'
            (tmp_path / "right").mkdir()
            async with forged_load_server() as forged_port:
                async with running_router(config, tmp_path / "right") as (url, router):
                    async with aiohttp.ClientSession() as s:
                        await async_wait_for(lambda: agent_reports(s, url, "tok"), 20,
                                             "the agent's proven reports")  # fmt: skip
                        register_forgery(consul, rogue_engine, forged_port)

                        async def settled() -> bool:
                            cut = counter(router, "gpuroute_load_streams_refused",
                                          reason="no_proof")  # fmt: skip
                            row = (await backends_state(s, url)).get("rogue")
                            return row is not None and (cut >= 1 or row["agent"] is not None)

                        await async_wait_for(settled, 20, "the forged stream to answer")
                        assert (await backends_state(s, url))["rogue"]["agent"] is None
        finally:
            agent.stop()


async def agent_reports(session: aiohttp.ClientSession, url: str, backend: str) -> bool:
    row = (await backends_state(session, url)).get(backend)
    return row is not None and row["agent"] is not None and row["agent"]["fresh"]


async def a_router_with_the_wrong_token_is_refused(consul: ConsulDev, tmp_dir) -> None:
    tmp_dir.mkdir()
    config = membership_toml(consul.address) + f'load_stream_token = "not-{TOKEN}"\n'
    async with running_router(config, tmp_dir) as (url, router):
        async with aiohttp.ClientSession() as s:

            async def refused() -> bool:
                n = counter(router, "gpuroute_load_streams_refused", reason="agent_refused")
                return n >= 1 and "tok" in await backends_state(s, url)

            await async_wait_for(refused, 20, "the agent refusing the wrong token")
            assert (await backends_state(s, url))["tok"]["agent"] is None
