"""Declared hardware and model shapes drive the priors: the roofline's rates follow the
declared figures exactly, tensor parallelism splits the model and adds its all-reduces,
an MoE is computed from its active parameters and stored from its total, and the router
and the simulator key their priors by engine kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuroute.router.backends.assemble import build_scheduler, prior_book
from gpuroute.router.backends.priors import PriorBook
from gpuroute.router.config.router import RouterConfig

from gpuroute.config import ConfigError, validate
from gpuroute.gpus import GPU_SPECS, GpuCatalog, GpuSpec, GpuTypeConfig
from gpuroute.models import MODELS
from gpuroute.roofline import ALLREDUCE_LATENCY_S, EngineKind, EngineParams

H100 = GPU_SPECS["H100"]
MBU, MFU = 0.75, 0.55  # EngineParams' defaults


def twice_the_bandwidth() -> GpuSpec:
    return GpuSpec("FAST-MEM", H100.memory_gb, 2 * H100.memory_bandwidth_tbs, H100.fp16_tflops,
                   700, interconnect_gbs=900)  # fmt: skip


def test_a_declared_gpu_is_priced_from_its_figures() -> None:
    model = MODELS["llama-3.1-8b"]
    ref, fast = EngineParams(H100, model), EngineParams(twice_the_bandwidth(), model)
    # decode reads weights and KV at the declared bandwidth: exactly half the time
    assert fast.weights_read_s == pytest.approx(ref.weights_read_s / 2, rel=1e-12)
    assert fast.kv_read_s_per_token == pytest.approx(ref.kv_read_s_per_token / 2, rel=1e-12)
    # same FLOPS, same memory: prefill and KV capacity unchanged
    assert fast.prefill_linear_s == ref.prefill_linear_s
    assert fast.kv_capacity_tokens == ref.kv_capacity_tokens
    # 8.03e9 B of FP8 weights / (3.35e12 B/s x 0.75) = 3.196 ms on an H100
    assert ref.weights_read_s == pytest.approx(8.03e9 / (3.35e12 * MBU), rel=1e-12)


def test_tensor_parallel_splits_the_model_and_adds_its_all_reduces() -> None:
    h200, model = GPU_SPECS["H200"], MODELS["llama-3.1-70b"]
    tp4 = EngineParams(h200, model, tp=4)
    weights = 70_553_706_496  # bytes at FP8 (one byte per parameter)
    # four GPUs read a quarter of the weights each, at the same time
    assert tp4.weights_read_s == pytest.approx(weights / (4 * 4.8e12 * MBU), rel=1e-12)
    # KV: four GPUs' memory at 90 % less the weights, over 80 layers x 2 x 8 heads x 128 x 2 B
    assert tp4.kv_capacity_tokens == int((4 * 141e9 * 0.9 - weights) / 327_680)
    # two all-reduces per layer of hidden x 2 B per token, ring 2(n-1)/n, over 900 GB/s NVLink
    assert tp4.comm_s_per_token == pytest.approx(160 * 1.5 * 8192 * 2 / 900e9, rel=1e-12)
    assert tp4.comm_step_s == pytest.approx(160 * ALLREDUCE_LATENCY_S)
    # a decode step carries them: one sequence costs the step plus its token's share
    alone = tp4.step_overhead_s + tp4.weights_read_s + 1000 * tp4.kv_read_s_per_token
    assert tp4.step_s(1, 1000) == pytest.approx(alone + tp4.comm_step_s + tp4.comm_s_per_token)
    # a 70B does not fit an L4 (24 GB); on one H100 it leaves 72 - 70.6 GB for its KV
    with pytest.raises(ValueError, match="does not fit on L4"):
        EngineParams(GPU_SPECS["L4"], model)
    one, two = EngineParams(H100, model), EngineParams(H100, model, tp=2)
    assert one.kv_capacity_tokens == int((80e9 * 0.9 - weights) / 327_680)  # 4,426 tokens
    assert two.kv_capacity_tokens == int((160e9 * 0.9 - weights) / 327_680)


def test_the_same_engine_over_a_slower_link_pays_more_for_its_all_reduces() -> None:
    model = MODELS["llama-3.1-70b"]
    pcie = GpuSpec("H100-PCIE", 80, 3.35, 989, 700, interconnect_gbs=64)
    nvlink = EngineParams(H100, model, tp=4)
    slow = EngineParams(pcie, model, tp=4)
    assert slow.comm_s_per_token == pytest.approx(nvlink.comm_s_per_token * 900 / 64)
    assert slow.prefill_s(2000) > nvlink.prefill_s(2000)
    # one GPU: no all-reduce at all
    assert EngineParams(H100, MODELS["llama-3.1-8b"]).comm_s_per_token == 0.0


def test_pipeline_parallel_pools_memory_without_speeding_a_step() -> None:
    model = MODELS["llama-3.1-70b"]
    pp2 = EngineParams(H100, model, pp=2)
    assert pp2.kv_capacity_tokens == int((2 * 80e9 * 0.9 - 70_553_706_496) / 327_680)
    assert pp2.weights_read_s == pytest.approx(70_553_706_496 / (3.35e12 * MBU), rel=1e-12)


def test_an_moe_computes_with_its_active_parameters_and_stores_all() -> None:
    moe = EngineParams(GPU_SPECS["MI300X"], MODELS["qwen3-30b-a3b"])
    # compute: 2 x 3,353,032,704 active parameters per token at 1,307 TFLOPS x 0.55
    assert moe.prefill_linear_s == pytest.approx(2 * 3_353_032_704 / (1307e12 * MFU), rel=1e-12)
    # memory: all 30,532,122,624 parameters are read each step
    assert moe.weights_read_s == pytest.approx(30_532_122_624 / (5.3e12 * MBU), rel=1e-12)


def test_prior_capacities_follow_the_declared_specs() -> None:
    gpus = GpuCatalog([twice_the_bandwidth()])
    book = PriorBook(gpus)
    fast, ref = book.table["FAST-MEM"], book.table["H100"]
    # the reference request (1000 in, 250 out): faster, far from twice (prefill and the
    # saturated batch's compute do not speed up)
    assert 1.1 < fast.capacity / ref.capacity < 2.0
    assert fast.cost.decode_s_per_token < ref.cost.decode_s_per_token
    assert fast.cost.prefill_s_per_token == pytest.approx(ref.cost.prefill_s_per_token)
    seventy = book.ensure(EngineKind("H200", "llama-3.1-70b", tp=4))
    assert seventy == "H200-tp4/llama-3.1-70b"
    # a 70B on four H200s serves fewer reference requests than an 8B on one H100
    assert book.table[seventy].capacity < 1.0
    assert book.ensure(EngineKind("H100", "llama-3.1-8b")) == "H100"  # the default shape


ROUTER_TOML = """
[[gpu_types]]
name = "A800"
memory_gb = 80
memory_bandwidth_tbs = 2.039
fp16_tflops = 312
interconnect_gbs = 400
price_per_hour = 2.2

[[models]]
name = "llama-3.1-70b"
fallback = ["llama-3.1-8b"]

[[backends]]
url = "http://127.0.0.1:9001"
gpu = "H200"
models = ["llama-3.1-70b"]
tensor_parallel = 4

[[backends]]
url = "http://127.0.0.1:9002"
gpu = "A800"
models = ["llama-3.1-70b"]
tensor_parallel = 4

[[backends]]
url = "http://127.0.0.1:9003"
gpu = "A800"
models = ["llama-3.1-8b"]
"""


def router_config(text: str, tmp_path: Path) -> RouterConfig:
    import tomllib

    return validate(tmp_path / "router.toml", tomllib.loads(text), RouterConfig)


def test_a_router_keys_priors_by_engine_kind(tmp_path: Path) -> None:
    config = router_config(ROUTER_TOML, tmp_path)
    scheduler = build_scheduler(config, prior_book(config))
    kinds = {b.backend_id: (b.gpu_type, b.gpu, b.gpus) for b in scheduler.backends}
    assert kinds == {
        "127.0.0.1:9001": ("H200-tp4/llama-3.1-70b", "H200", 4),
        "127.0.0.1:9002": ("A800-tp4/llama-3.1-70b", "A800", 4),
        "127.0.0.1:9003": ("A800", "A800", 1),
    }
    h200 = scheduler.estimator.seconds("H200-tp4/llama-3.1-70b", 1.0, 1000, 250)
    a800 = scheduler.estimator.seconds("A800-tp4/llama-3.1-70b", 1.0, 1000, 250)
    # the same 70B at TP4: the declared A800 (2.04 TB/s, 312 TFLOPS) costs more per request
    # than the built-in H200 (4.8 TB/s, 989 TFLOPS): between their bandwidth ratio (decode)
    # and their FLOPS ratio (prefill)
    assert 4.8 / 2.039 < a800 / h200 < 989 / 312


@pytest.mark.parametrize(
    ("replace", "key", "words"),
    [
        ('gpu = "A800"\nmodels = ["llama-3.1-8b"]', "backends[2].gpu",
         "unknown GPU type 'B300'"),
        ('name = "A800"', "gpu_types", "declared twice"),
    ],
)  # fmt: skip
def test_gpu_type_errors_name_the_key(tmp_path: Path, replace: str, key: str, words: str) -> None:
    text = ROUTER_TOML
    if "B300" in words:
        text = text.replace(replace, 'gpu = "B300"\nmodels = ["llama-3.1-8b"]')
    else:
        text = text + '\n[[gpu_types]]\nname = "A800"\nmemory_gb = 1\n'
        text += "memory_bandwidth_tbs = 1\nfp16_tflops = 1\n"
    with pytest.raises(ConfigError) as caught:
        router_config(text, tmp_path)
    message = str(caught.value)
    assert "router.toml" in message and key in message and words in message
    if "B300" in words:
        assert "[[gpu_types]]" in message


def test_a_model_that_does_not_fit_names_the_backend(tmp_path: Path) -> None:
    h200 = 'gpu = "H200"\nmodels = ["llama-3.1-70b"]\ntensor_parallel = 4'
    text = ROUTER_TOML.replace(h200, 'gpu = "L4"\nmodels = ["llama-3.1-70b"]\ntensor_parallel = 2')
    config = router_config(text, tmp_path)
    with pytest.raises(ConfigError, match=r"backends\[0\] .*does not fit on 2 × L4"):
        build_scheduler(config, prior_book(config))


def test_declared_device_names_map_to_the_declared_type() -> None:
    a800 = GpuTypeConfig(
        name="A800", memory_gb=80, memory_bandwidth_tbs=2.039, fp16_tflops=312,
        device_names=["NVIDIA A800-SXM4-80GB"],
    )  # fmt: skip
    catalog = GpuCatalog.of([a800])
    assert catalog.type_of_device("NVIDIA A800-SXM4-80GB") == "A800"
    assert catalog.type_of_device("NVIDIA H100 80GB HBM3") == "H100"


FIXTURES = Path(__file__).parent.parent / "fixtures" / "hf_configs"


def test_a_router_model_from_config_json_is_priced_from_it(tmp_path: Path) -> None:
    (tmp_path / "mixtral").mkdir()
    (tmp_path / "mixtral" / "config.json").write_text((FIXTURES / "mixtral-8x7b.json").read_text())
    text = """
[[models]]
name = "mistralai/Mixtral-8x7B-Instruct-v0.1"
config_json = "mixtral/config.json"
weight_dtype = "fp8"

[[backends]]
url = "http://127.0.0.1:9001"
gpu = "H100"
models = ["mistralai/Mixtral-8x7B-Instruct-v0.1"]
"""
    config = router_config(text, tmp_path)  # relative to the config file's directory
    scheduler = build_scheduler(config, prior_book(config))
    (backend,) = scheduler.backends
    assert backend.gpu_type == "H100/mistralai/Mixtral-8x7B-Instruct-v0.1"
    book = prior_book(config)
    spec = book.shapes["mistralai/Mixtral-8x7B-Instruct-v0.1"]
    assert spec.active_params_b == pytest.approx(12.88, abs=0.01)  # 2 of 8 experts


def test_an_unreadable_config_json_names_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"model_type": "llama", "hidden_size": 4096}')
    text = '[[models]]\nname = "m"\nconfig_json = "broken.json"\n\n[[backends]]\n'
    text += 'url = "http://127.0.0.1:9001"\ngpu = "H100"\nmodels = ["m"]\n'
    with pytest.raises(ConfigError) as caught:
        router_config(text, tmp_path)
    message = str(caught.value)
    assert "router.toml: models[0]" in message and "broken.json" in message
    assert "num_hidden_layers" in message or "missing" in message
    text = text.replace("broken.json", "absent.json")
    with pytest.raises(ConfigError, match=r"models\[0\].*absent\.json"):
        router_config(text, tmp_path)
