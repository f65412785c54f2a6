"""The fake engine on a declared GPU type, a model shape from a file, tensor parallel: its
settings, `gpuroute fake-engine --specs FILE --tensor-parallel N` and their errors."""

from __future__ import annotations

import asyncio

import pytest
from gpuroute.testbed.cli import fake_engine_config
from gpuroute.testbed.engine_specs import BUILTIN_SPECS, load_engine_specs
from gpuroute.testbed.fake_engine.server import FakeEngine, FakeEngineConfig
from support.paths import REPO

from gpuroute.cli import build_parser
from gpuroute.config import ConfigError
from gpuroute.gpus import GPU_SPECS, GpuSpec
from gpuroute.models import MODELS

REAL_FLEET = REPO / "sim" / "scenarios" / "real-fleet.toml"
A800 = GpuSpec("A800", 80, 2.039, 312, 0.0, None, 400, 2.2, ("NVIDIA A800-SXM4-80GB",))


def args(*argv: str):
    return build_parser().parse_args(["fake-engine", *argv])


def test_a_scenario_declares_the_gpu_and_the_engine_spans_four_of_them() -> None:
    specs = load_engine_specs(REAL_FLEET)
    assert specs.gpu("A800") == A800 and specs.gpu("H200") == GPU_SPECS["H200"]
    assert specs.model("llama-3.1-70b") == MODELS["llama-3.1-70b"]
    config = fake_engine_config(
        args("--gpu", "A800", "--model", "llama-3.1-70b", "--tensor-parallel", "4",
             "--specs", str(REAL_FLEET))
    )  # fmt: skip
    assert (config.gpu, config.model, config.tensor_parallel) == ("A800", "llama-3.1-70b", 4)
    params = config.engine_params()
    weights = MODELS["llama-3.1-70b"].weight_total_bytes
    assert params.tp == 4 and params.gpu == A800
    assert params.kv_capacity_tokens == int((4 * 80e9 * 0.9 - weights) / 327_680)


def test_a_router_config_declares_a_shape_of_its_own(tmp_path) -> None:
    path = tmp_path / "router.toml"
    path.write_text(
        'policy = "slo_aware"\n'  # the rest of the file is not read
        '[[gpu_types]]\nname = "X9"\nmemory_gb = 96\nmemory_bandwidth_tbs = 3\n'
        "fp16_tflops = 500\n"
        '[[models]]\nname = "tiny-moe"\nparams_b = 16\nactive_params_b = 2\nlayers = 24\n'
        "hidden = 2048\nkv_heads = 4\nhead_dim = 128\nmax_model_len = 32768\n"
        '[[models]]\nname = "llama-3.1-8b"\nfallback = ["tiny-moe"]\n'  # no shape: its own
        '[[backends]]\nurl = "http://127.0.0.1:1"\ngpu = "X9"\nmodels = ["tiny-moe"]\n'
    )
    config = fake_engine_config(
        args("--gpu", "X9", "--model", "tiny-moe", "--served-name", "moe", "--specs", str(path))
    )
    engine = FakeEngine(config)
    assert engine.name == "moe" and engine.params.model.active_params_b == 2
    assert engine.max_model_len == 32768  # the model's, as its KV cache holds more
    assert load_engine_specs(path).model("llama-3.1-8b") == MODELS["llama-3.1-8b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('policy = "x"\n', "declares no [[gpu_types]] and no [[models]]"),
        ("[[gpu_types]]\nname = \"X9\"\nmemory_gb = 0\nmemory_bandwidth_tbs = 1\n"
         "fp16_tflops = 1\n", "gpu_types[0].memory_gb: must be > 0"),
        ('[[gpu_types]]\nname = "X9"\nmemory_gb = 1\n', "gpu_types[0].fp16_tflops: missing"),
        ('[[models]]\nname = "m"\nparams_b = 1\n', "models[0]: an explicit shape needs"),
        ('[[models]]\nname = "m"\nshape = "nope"\n', "models[0]: unknown model shape 'nope'"),
        ('[[models]]\nname = "m"\nshape = "qwen3-8b"\n[[models]]\nname = "m"\n'
         'shape = "qwen3-8b"\n', "models: model 'm' is listed twice"),
        ("[[models\n", "invalid TOML"),
    ],
)  # fmt: skip
def test_a_specs_file_error_names_the_file_and_the_key(tmp_path, text, message) -> None:
    path = tmp_path / "specs.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_engine_specs(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_unknown_names_say_what_is_known_and_where_to_declare_them(tmp_path) -> None:
    declare = r"declare it under \[\[gpu_types\]\] in a file given as --specs"
    with pytest.raises(
        ValueError, match=r"--gpu: unknown GPU type 'A800'; known: H100.*" + declare
    ):
        fake_engine_config(args("--gpu", "A800"))
    with pytest.raises(ValueError, match=rf"--model: unknown model shape 'm'.*in {REAL_FLEET}"):
        fake_engine_config(args("--model", "m", "--specs", str(REAL_FLEET)))
    with pytest.raises(ConfigError, match="file not found"):
        fake_engine_config(args("--specs", str(tmp_path / "missing.toml")))
    assert BUILTIN_SPECS.gpu("L4") == GPU_SPECS["L4"]


def test_a_degree_out_of_range_or_a_model_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel must be in 1\.\.64"):
        FakeEngineConfig(tensor_parallel=0)
    with pytest.raises(ValueError, match=r"llama-3.1-405b does not fit on 2 × L4"):
        FakeEngineConfig(gpu="L4", model="llama-3.1-405b", tensor_parallel=2)
    # a spec given replaces the built-in table's, and names the engine's GPU and model
    config = FakeEngineConfig(gpu_spec=A800, model_spec=MODELS["qwen3-30b-a3b"])
    assert (config.gpu, config.model) == ("A800", "qwen3-30b-a3b")


def test_telemetry_lists_the_group_of_gpus_and_server_info_its_degree() -> None:
    config = FakeEngineConfig(gpu_spec=A800, model="llama-3.1-70b", tensor_parallel=4)
    engine = FakeEngine(config)
    asyncio.run(engine._start(None))

    async def body(handler) -> dict:
        import json

        return json.loads((await handler(None)).body)

    gpus = asyncio.run(body(engine.gpu_state))["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    weights = MODELS["llama-3.1-70b"].weight_total_bytes
    assert all(g["memory_total"] == 80e9 and g["memory_used"] == int(weights / 4) for g in gpus)
    parallel = asyncio.run(body(engine.server_info))["vllm_config"]["parallel_config"]
    assert parallel == {"tensor_parallel_size": 4, "pipeline_parallel_size": 1,
                        "data_parallel_size": 1}  # fmt: skip
    # the agent reads the degree where vLLM says it (agent/core/engine_facts.py)
    from gpuroute.agent.core.engine_facts import parse_parallel

    assert parse_parallel("vllm", {"vllm_config": {"parallel_config": parallel}}).tp == 4
    models = asyncio.run(body(engine.models))["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("llama-3.1-70b", 131072)]
