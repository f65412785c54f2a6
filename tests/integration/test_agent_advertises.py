"""Real agent processes, a fake engine and a real `consul agent -dev` on loopback: the
service Meta carries what the engine itself says it serves (GET /v1/models), its context
length and its parallel layout (the fake engine answers vLLM's dev-mode /server_info), over
whatever the agent's config claims, and a config that disagrees is logged naming both. An
engine is registered only once it serves every model of the agent's `engine.models`."""

from __future__ import annotations

from support.live import MODEL, AgentProcess, FakeEngineProcess, agent_toml, get_json, wait_for


def service_meta(consul, agent_id: str) -> dict[str, str]:
    service = get_json(f"{consul.address}/v1/agent/service/{agent_id}") or {}
    return service.get("Meta") or {}


def test_consul_meta_carries_the_engines_models_context_length_and_degrees(
    consul, tmp_path
) -> None:
    engine = FakeEngineProcess("H200", extra=("--tensor-parallel", "2"))
    agents: list[AgentProcess] = []
    try:
        (card,) = get_json(engine.url + "/v1/models")["data"]
        # no [engine] models and no degrees: all of it from the engine
        learned = agent_toml(engine, consul.address, "learned").replace(
            f'models = ["{MODEL}"]\n', ""
        )
        # a config the engine contradicts: TP4
        told = agent_toml(engine, consul.address, "told").replace(
            "[telemetry]", "tensor_parallel = 4\n[telemetry]"
        )
        agents += [AgentProcess(learned, tmp_path, "learned"), AgentProcess(told, tmp_path, "told")]
        for agent_id in ("learned", "told"):
            wait_for(
                lambda a=agent_id: "max_model_len" in service_meta(consul, a),
                20,
                f"{agent_id} registered with what its engine serves",
            )
        metas = {a: service_meta(consul, a) for a in ("learned", "told")}
        told_log = (tmp_path / "told.log").read_text()
    finally:
        for agent in agents:
            agent.stop()
        engine.stop()
    print(f"\nMeta learned from the engine: {metas['learned']}")
    for meta in metas.values():
        assert meta["models"] == card["id"] == MODEL
        assert meta["max_model_len"] == str(card["max_model_len"])
        assert (meta["tensor_parallel"], meta["pipeline_parallel"]) == ("2", "1")
        assert (meta["data_parallel"], meta["gpu_count"], meta["gpu_model"]) == ("1", "2", "H200")
    assert "says tensor_parallel=4 pipeline_parallel=1 data_parallel=1 (4 GPUs)" in told_log
    assert "the engine reports tensor_parallel=2 pipeline_parallel=1" in told_log


def test_an_engine_serving_another_model_stays_unregistered_until_its_model_loads(
    consul, tmp_path
) -> None:
    """The host's engine still serves another model (a previous deployment, a load under
    way): the agent says what is missing and registers nothing; once the engine serves the
    agent's model, it registers."""
    engine = FakeEngineProcess("H100", extra=("--served-name", "qwen3-8b"))
    agent = AgentProcess(agent_toml(engine, consul.address, "waits"), tmp_path, "waits")
    try:
        missing = (
            f"engine.models is ['{MODEL}'] but the engine serves ['qwen3-8b'] (GET "
            f"/v1/models); the agent registers the engine only once it serves ['{MODEL}']"
        )
        wait_for(lambda: missing in (tmp_path / "waits.log").read_text(), 20, "the agent says")
        assert get_json(f"{consul.address}/v1/agent/services") == {}
        engine.stop()  # the engine comes back serving the pool's model
        engine = FakeEngineProcess("H100", port=engine.port)
        wait_for(lambda: service_meta(consul, "waits").get("models") == MODEL, 20, "registered")
        log = (tmp_path / "waits.log").read_text()
    finally:
        agent.stop()
        engine.stop()
    assert f"engine loaded: serves {MODEL}, /health OK; registering" in log
    assert log.count(missing) == 1  # said once, not at every read
