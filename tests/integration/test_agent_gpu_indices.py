"""Two engines on one 8-GPU host, each with its own agent: with `telemetry.gpu_indices` each
agent reports its own engine's four GPUs (real agent processes, the fake engine's simulated
GPUs, a real `consul agent -dev`)."""

from __future__ import annotations

import tomllib

from support.live import AgentProcess, FakeEngineProcess, agent_toml, get_json, wait_for


def test_two_agents_on_one_host_each_report_their_own_gpus(consul, tmp_path) -> None:
    host = FakeEngineProcess("H100", extra=("--tensor-parallel", "8"))  # 8 simulated GPUs
    agents, admins = [], {}
    try:
        for name, indices in (("first", "[0, 1, 2, 3]"), ("second", "[4, 5, 6, 7]")):
            text = agent_toml(host, consul.address, name).replace(
                "[telemetry]\n", f"[telemetry]\ngpu_indices = {indices}\n"
            )
            admins[name] = f"http://127.0.0.1:{tomllib.loads(text)['admin']['port']}/status"
            agents.append(AgentProcess(text, tmp_path, name))

        def gpus(name: str) -> list[int] | None:
            status = get_json(admins[name]) or {}
            return (status.get("gpu") or {}).get("indices") or None

        for name in admins:
            wait_for(lambda n=name: gpus(n) is not None, 20, f"{name} reads its GPUs")
        seen = {name: gpus(name) for name in admins}
        errors = {name: get_json(admins[name])["gpu"]["error"] for name in admins}
    finally:
        for agent in agents:
            agent.stop()
        host.stop()
    assert seen == {"first": [0, 1, 2, 3], "second": [4, 5, 6, 7]}
    assert errors == {"first": None, "second": None}
