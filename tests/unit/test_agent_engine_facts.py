"""What the agent learns from its engine and advertises: /v1/models (LoRA adapters included),
the parallel layout, the config rules for tensor_parallel, pipeline_parallel and gpu_count,
and the Consul Meta that carries them."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from aiohttp import ClientSession, web
from gpuroute.agent.config import AgentConfig, load_agent_config
from gpuroute.agent.core.engine_facts import (
    EngineFacts,
    Parallelism,
    ServedModel,
    facts,
    fit_models,
    model_problems,
    parse_models,
    parse_parallel,
)
from gpuroute.agent.engine_info import EngineInfo
from gpuroute.agent.registration import Registration, service_definition

from gpuroute.config import ConfigError

# what vLLM 0.32 answers with one base model and two LoRA adapters loaded
# (vllm/entrypoints/openai/models/serving.py: adapters carry root = their path and
# parent = the base, and no max_model_len)
VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": "llama-3.1-8b", "object": "model", "owned_by": "vllm",
         "root": "/models/llama-3.1-8b", "parent": None, "max_model_len": 8192},
        {"id": "sql-lora", "object": "model", "owned_by": "vllm", "root": "/adapters/sql",
         "parent": "llama-3.1-8b", "max_model_len": None},
        {"id": "chat-lora", "object": "model", "root": "/adapters/chat",
         "parent": "llama-3.1-8b"},
        {"object": "model"},  # no id: skipped
    ],
}  # fmt: skip
# vLLM's GET /server_info?config_format=json (VLLM_SERVER_DEV_MODE=1), trimmed
VLLM_SERVER_INFO = {
    "vllm_config": {
        "model_config": {"max_model_len": 8192},
        "parallel_config": {
            "tensor_parallel_size": 4,
            "pipeline_parallel_size": 2,
            "data_parallel_size": 1,
            "world_size": 8,
        },
    },
    "vllm_env": {},
}


def test_models_list_parses_bases_and_lora_adapters_by_their_parent() -> None:
    served = parse_models(VLLM_MODELS)
    assert served == [
        ServedModel("llama-3.1-8b", None, 8192),
        ServedModel("sql-lora", "llama-3.1-8b", None),
        ServedModel("chat-lora", "llama-3.1-8b", None),
    ]
    assert [m.adapter for m in served] == [False, True, True]
    with pytest.raises(ValueError, match="model list"):
        parse_models({"object": "list"})


def test_parallel_layout_from_vllm_dev_server_info_and_sglang_server_info() -> None:
    assert parse_parallel("vllm", VLLM_SERVER_INFO) == Parallelism(4, 2, 1)
    # the text form (the default) is one string: nothing to read
    assert parse_parallel("vllm", {"vllm_config": "model='m', tensor_parallel_size=4"}) is None
    sglang = {"tp_size": 2, "pp_size": 1, "dp_size": 2, "model_path": "m"}
    assert parse_parallel("sglang", sglang) == Parallelism(2, 1, 2)
    assert parse_parallel("tgi", sglang) is None  # TGI's /info says nothing of it
    assert parse_parallel("sglang", {"tp_size": True}) is None


def test_a_mismatch_names_both_lists_but_unlisted_adapters_are_none() -> None:
    served = parse_models(VLLM_MODELS)
    assert model_problems(None, served) is None
    assert model_problems(["llama-3.1-8b"], served) is None  # adapters load at run time
    problem = model_problems(["llama-3.1-70b"], served)
    assert problem == (
        "engine.models is ['llama-3.1-70b'] but the engine serves "
        "['llama-3.1-8b', 'sql-lora', 'chat-lora'] (GET /v1/models); "
        "the agent registers the engine only once it serves ['llama-3.1-70b']"
    )
    unlisted = model_problems(["sql-lora"], served)  # the base model left out: it is served
    assert unlisted is not None and unlisted.endswith("advertising what the engine serves")


def test_advertised_facts_are_the_engines_once_it_answered() -> None:
    declared = Parallelism(2, 1, 1)
    before = facts(["llama-3.1-8b"], declared, None, None)
    assert before == EngineFacts(("llama-3.1-8b",), declared)
    after = facts(["llama-3.1-8b"], declared, parse_models(VLLM_MODELS), Parallelism(4, 2, 1))
    assert after.models == ("llama-3.1-8b", "sql-lora", "chat-lora")
    assert after.adapters == ("sql-lora", "chat-lora")
    assert after.max_model_len == 8192 and after.parallel == Parallelism(4, 2, 1)
    two_bases = [ServedModel("a", None, 4096), ServedModel("b", None, 32768)]
    assert facts(None, declared, two_bases, None).max_model_len == 4096  # fits both


def test_served_names_that_overflow_consuls_meta_value_drop_adapters_first() -> None:
    served = [ServedModel(f"lora-{i:03d}-" + "x" * 40, "base") for i in range(20)]
    served.insert(5, ServedModel("base"))
    kept = fit_models(served)
    assert kept[0] == "base" and len(",".join(kept)) <= 512
    assert kept[1:] == tuple(m.id for m in served if m.adapter)[: len(kept) - 1]
    assert len(kept) < len(served)


def agent(engine: dict, **top) -> AgentConfig:
    body = {"id": "h1", "engine": {"gpu": "H100", "url": "http://10.0.0.5:8001"} | engine} | top
    return AgentConfig.model_validate(body, context=AgentConfig.validation_context(body))


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ({}, Parallelism(1, 1, 1)),
        ({"gpu_count": 4}, Parallelism(4, 1, 1)),  # an old config: one engine on its GPUs
        ({"gpu_count": 8, "pipeline_parallel": 2}, Parallelism(4, 2, 1)),
        ({"tensor_parallel": 4}, Parallelism(4, 1, 1)),
        ({"tensor_parallel": 4, "gpu_count": 8}, Parallelism(4, 1, 2)),  # two DP ranks
        ({"tensor_parallel": 2, "pipeline_parallel": 2, "gpu_count": 8}, Parallelism(2, 2, 2)),
    ],
)
def test_the_configured_layout(engine: dict, expected: Parallelism) -> None:
    assert agent(engine).engine.parallel == expected


@pytest.mark.parametrize(
    ("engine", "key", "message"),
    [
        ("tensor_parallel = 4\ngpu_count = 6", "engine.gpu_count",
         "not a whole number of engine ranks of tensor_parallel x pipeline_parallel = 4 x 1"),
        ("pipeline_parallel = 4\ngpu_count = 6", "engine.gpu_count",
         "do not split into pipeline_parallel = 4 stages"),
        ("tensor_parallel = 0", "engine.tensor_parallel", "must be >= 1"),
        ("pipeline_parallel = 65", "engine.pipeline_parallel", "must be <= 64"),
        ("models = []", "engine.models", "at least 1"),
        ("models_interval_s = 0.1", "engine.models_interval_s", "must be >= 1"),
    ],
)  # fmt: skip
def test_bad_parallel_or_models_keys_name_file_and_key(tmp_path, engine, key, message) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(f'[engine]\ngpu = "H100"\n{engine}\n')
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert f"{path}: {key}: " in str(err.value) and message in str(err.value)


def test_meta_carries_degrees_served_models_and_context_length() -> None:
    config = agent(
        {"gpu": "X9", "tensor_parallel": 4, "gpu_count": 8},
        gpu_types=[{"name": "X9", "memory_gb": 96, "memory_bandwidth_tbs": 4, "fp16_tflops": 500}],
    )
    meta = service_definition(config, 7070, "critical")["Meta"]
    assert (meta["tensor_parallel"], meta["pipeline_parallel"], meta["data_parallel"]) == (
        "4", "1", "2",
    )  # fmt: skip
    assert meta["gpu_count"] == "8" and meta["gpu_memory_gb"] == "96"  # the declared type
    assert meta["models"] == "" and "max_model_len" not in meta  # nothing learned yet
    learned = facts(None, config.engine.parallel, parse_models(VLLM_MODELS), Parallelism(4))
    meta = service_definition(config, 7070, "passing", learned)["Meta"]
    assert meta["models"] == "llama-3.1-8b,sql-lora,chat-lora"
    assert meta["max_model_len"] == "8192"
    assert (meta["tensor_parallel"], meta["data_parallel"], meta["gpu_count"]) == ("4", "1", "4")


@contextlib.asynccontextmanager
async def engine_app(routes: dict[str, object]):
    """An engine on loopback answering GET `path` with the JSON given (or the status, when
    an int), and counting the requests per path."""
    hits: dict[str, int] = {}

    async def answer(request: web.Request) -> web.Response:
        hits[request.path] = hits.get(request.path, 0) + 1
        body = routes.get(request.path, 404)
        return web.Response(status=body) if isinstance(body, int) else web.json_response(body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", hits
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_engine_info_reads_the_engine_and_warns_naming_both_lists(caplog) -> None:
    caplog.set_level(logging.INFO, "gpuroute.agent.engine")
    changes: list[EngineFacts] = []
    routes = {"/v1/models": VLLM_MODELS, "/server_info": VLLM_SERVER_INFO}
    async with engine_app(routes) as (url, hits), ClientSession() as session:
        config = agent({"url": url, "models": ["llama-3.1-70b"], "tensor_parallel": 2})
        info = EngineInfo(config, changes.append)
        assert info.known.is_set() and info.facts.models == ("llama-3.1-70b",)
        learned = await info.read(session)
        again = await info.read(session)  # no change: no second announcement
    assert learned == again == info.facts and changes == [learned]
    assert learned.models == ("llama-3.1-8b", "sql-lora", "chat-lora")
    assert learned.parallel == Parallelism(4, 2, 1) and learned.max_model_len == 8192
    assert hits == {"/v1/models": 2, "/server_info": 1}  # the layout is read once per start
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("['llama-3.1-70b']" in w and "'llama-3.1-8b'" in w for w in warnings)
    assert any(
        "tensor_parallel=2" in w and "tensor_parallel=4 pipeline_parallel=2" in w for w in warnings
    )


@pytest.mark.asyncio
async def test_without_configured_models_the_agent_waits_for_the_engine(caplog) -> None:
    caplog.set_level(logging.WARNING, "gpuroute.agent.engine")
    routes: dict[str, object] = {"/v1/models": 503}
    async with engine_app(routes) as (url, _hits), ClientSession() as session:
        info = EngineInfo(agent({"url": url}))
        await info.read(session)
        assert not info.known.is_set() and info.facts.models == ()
        assert "engine.models is not set, so the agent registers once it answers" in caplog.text
        routes["/v1/models"] = VLLM_MODELS
        await info.read(session)
    assert info.known.is_set() and info.facts.models[0] == "llama-3.1-8b"
    assert info.facts.parallel == Parallelism(1, 1, 1)  # /server_info: 404, the config stands


@pytest.mark.asyncio
async def test_the_engine_is_loaded_once_health_and_models_agree_with_the_config(caplog) -> None:
    """Registration waits for `loaded`: the agent's /health probe finds the engine up and
    /v1/models lists every name of engine.models; until then it says what is missing, once."""
    caplog.set_level(logging.INFO, "gpuroute.agent.engine")
    other = {"object": "list", "data": [{"id": "qwen3-8b", "object": "model"}]}
    routes: dict[str, object] = {"/v1/models": other}
    health = {"ok": True}
    async with engine_app(routes) as (url, _hits), ClientSession() as session:
        config = agent({"url": url, "models": ["llama-3.1-8b", "sql-lora"]})
        info = EngineInfo(config, healthy=lambda: health["ok"])
        assert info.known.is_set() and not info.loaded.is_set()  # the config's names only
        await info.read(session)
        await info.read(session)
        assert not info.loaded.is_set()
        routes["/v1/models"] = VLLM_MODELS  # the model has loaded: the 8B and its adapters
        health["ok"] = False  # but the probe last found the engine down
        await info.read(session)
        assert not info.loaded.is_set()
        health["ok"] = True
        await info.read(session)
    assert info.loaded.is_set()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    missing = "the agent registers the engine only once it serves ['llama-3.1-8b', 'sql-lora']"
    assert sum(missing in line for line in said) == 1, said  # said once, not at every read
    assert any(line.endswith("not registering yet: /health is not OK") for line in said), said
    assert "engine loaded: serves chat-lora,llama-3.1-8b,sql-lora, /health OK" in caplog.text


class RecordingConsul:
    """Consul's agent API as Registration uses it; each registration is queued."""

    def __init__(self) -> None:
        self.registered: asyncio.Queue[dict] = asyncio.Queue()

    async def register(self, definition: dict) -> None:
        await self.registered.put(definition)

    async def update_check(self, *_args) -> None:
        return None


@pytest.mark.asyncio
async def test_registration_waits_for_models_and_registers_again_when_they_change() -> None:
    config = agent({})
    consul = RecordingConsul()
    ready = asyncio.Event()
    current = [EngineFacts(("a",), Parallelism())]
    registration = Registration(
        config, consul, 7070, lambda: ("passing", "ok"), lambda: current[0], ready
    )
    task = asyncio.create_task(registration.run())
    try:
        await asyncio.sleep(0)  # let it start: it must not register before `ready`
        assert consul.registered.empty()
        ready.set()
        first = await asyncio.wait_for(consul.registered.get(), 5)
        current[0] = EngineFacts(("a", "a-lora"), Parallelism(), 4096, ("a-lora",), True)
        registration.refresh()
        second = await asyncio.wait_for(consul.registered.get(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert first["Meta"]["models"] == "a" and "max_model_len" not in first["Meta"]
    assert second["Meta"]["models"] == "a,a-lora" and second["Meta"]["max_model_len"] == "4096"
