"""A new policy with one setting, added as a test fixture by one file
(support/prefer_gpu_policy.py) and one registry line, runs in a live router in front of fake
engines (its setting read from `[policy_settings.prefer_gpu]`, changed by a reload, a bad
value refused naming the key) and in the simulator (`[router.policy_settings.prefer_gpu]`)."""

from __future__ import annotations

from collections import Counter

import aiohttp
import pytest
from gpuroute.router.core.policies import POLICIES
from gpuroute.sim.scenario import load_scenario
from gpuroute.sim.simulator import FleetSimulator
from support.live import chat_body, fake_engines, router_server, router_toml
from support.prefer_gpu_policy import PreferGpu

JSON = {"Content-Type": "application/json"}  # every admin write is JSON (admin_guard.py)


@pytest.fixture
def prefer_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one registry line (for this test only)."""
    monkeypatch.setitem(POLICIES, PreferGpu.name, PreferGpu)


def router_config(engines: list[tuple[str, str]], gpu: object) -> str:
    settings = {"policy_settings.prefer_gpu": f"gpu = {gpu!r}".replace("'", '"')}
    return router_toml(engines, policy="prefer_gpu", **settings)  # x-gpuroute-backend on


async def served_by(session: aiohttp.ClientSession, url: str, n: int = 12) -> Counter[str]:
    backends: Counter[str] = Counter()
    for _ in range(n):
        async with session.post(url + "/v1/chat/completions", json=chat_body(max_tokens=2)) as r:
            assert r.status == 200, await r.text()
            await r.read()
            backends[r.headers["x-gpuroute-backend"]] += 1
    return backends


@pytest.mark.asyncio
@pytest.mark.usefixtures("prefer_gpu")
async def test_a_new_policy_runs_in_the_router_with_its_setting(tmp_path) -> None:
    with fake_engines(("H100", 1.0), ("L4", 1.0)) as (h100, l4):
        engines = [(h100.url, "H100"), (l4.url, "L4")]
        async with router_server(router_config(engines, "L4"), tmp_path) as server:
            app, url = server.servable, f"http://127.0.0.1:{server.port}"
            app.operator.reloader.path = path = tmp_path / "router.toml"
            ids = {gpu: b.backend_id for b in app.scheduler.backends for gpu in [b.gpu]}
            async with aiohttp.ClientSession() as s:
                assert await served_by(s, url) == {ids["L4"]: 12}
                path.write_text(router_config(engines, "H100"))
                async with s.post(url + "/admin/reload", headers=JSON) as r:
                    assert r.status == 200, await r.text()
                assert await served_by(s, url) == {ids["H100"]: 12}
                path.write_text(router_config(engines, 3))  # the setting's type is checked
                async with s.post(url + "/admin/reload", headers=JSON) as r:
                    answer = await r.json()
                    assert r.status == 400, answer
                message = answer["error"]["message"]
                assert "policy_settings.prefer_gpu.gpu: expected a string, got 3" in message
                assert await served_by(s, url) == {ids["H100"]: 12}  # the old config runs on


SCENARIO = """
name = "prefer-gpu"
seed = 3
[workload]
profile = "chat"
target_utilization = 0.2
max_requests = 400
[[gpus]]
type = "H100"
count = 2
[[gpus]]
type = "L4"
count = 2
[router]
policies = ["prefer_gpu"]
[router.policy_settings.prefer_gpu]
gpu = "{gpu}"
"""


@pytest.mark.usefixtures("prefer_gpu")
@pytest.mark.parametrize("gpu", ["L4", "H100"])
def test_a_new_policy_runs_in_the_simulator_with_its_setting(tmp_path, gpu: str) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.format(gpu=gpu))
    report = FleetSimulator(load_scenario(path)).run("prefer_gpu")
    assert report.completed == 400
    shares = {name: row["request_share"] for name, row in report.by_gpu_type.items()}
    assert shares == {"H100": float(gpu == "H100"), "L4": float(gpu == "L4")}
