"""Model shapes from config.json, the built-in table and [[models]] tables: every figure here
is worked out by hand in the comment above it, not by the code under test."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.paths import REPO

from gpuroute.config import ConfigError, validate
from gpuroute.gpus import GPU_SPECS
from gpuroute.hf_config import ModelConfigError
from gpuroute.models import (
    MODELS,
    ModelShapeConfig,
    ModelSpec,
    builtin_or_error,
    load_hf_config,
    model_spec_from_hf_config,
)
from gpuroute.roofline import EngineParams

FIXTURES = REPO / "tests" / "fixtures" / "hf_configs"


def load(name: str) -> ModelSpec:
    return load_hf_config(FIXTURES / f"{name}.json")


def params(spec: ModelSpec) -> int:
    return round(spec.params_b * 1e9)


def active(spec: ModelSpec) -> int:
    return round((spec.active_params_b or spec.params_b) * 1e9)


def near(value: float, public: float) -> bool:
    """Within 2 % of a publicly quoted figure."""
    return abs(value / public - 1) < 0.02


# -- one config.json per family ------------------------------------------------------------
def test_llama_3_1_8b() -> None:
    spec = load("llama-3.1-8b")
    # embeddings 128256 × 4096 = 525,336,576, untied lm_head: × 2 = 1,050,673,152
    # per layer: q 4096×4096 = 16,777,216; k, v 4096×(8×128) = 4,194,304 each;
    #   o 16,777,216 → attention 41,943,040; MLP 3×4096×14336 = 176,160,768;
    #   2 norms × 4096 = 8,192 → 218,112,000
    # 32 layers 6,979,584,000 + 1,050,673,152 + final norm 4,096 = 8,030,261,248
    assert params(spec) == 8_030_261_248 and near(params(spec), 8.03e9)
    assert spec.active_params_b is None
    # 32 layers × 2 (K and V) × 8 heads × 128 × 2 B = 131,072
    assert spec.kv_bytes_per_token == 131_072
    # 2 × 8,030,261,248 = 16,060,522,496
    assert spec.flops_per_token == pytest.approx(16_060_522_496, rel=1e-12)
    # BF16: 2 B × 8,030,261,248 = 16,060,522,496
    assert spec.weight_total_bytes == pytest.approx(16_060_522_496, rel=1e-12)
    assert (spec.name, spec.family, spec.max_model_len) == ("llama-3.1-8b", "llama", 131072)
    assert (spec.layers, spec.kv_heads, spec.head_dim, spec.hidden) == (32, 8, 128, 4096)


def test_qwen2_5_7b() -> None:
    spec = load("qwen2.5-7b")
    # embeddings 152064 × 3584 = 544,997,376, untied: 1,089,994,752
    # head_dim 3584 / 28 = 128; q 3584×3584 = 12,845,056; k, v 3584×(4×128) = 1,835,008
    #   each; o 12,845,056 → 29,360,128; q, k, v biases 3,584 + 512 + 512 = 4,608;
    #   MLP 3×3584×18944 = 203,685,888; norms 7,168 → 233,057,792 per layer
    # 28 layers 6,525,618,176 + 1,089,994,752 + 3,584 = 7,615,616,512 (Qwen: 7.61 B)
    assert params(spec) == 7_615_616_512 and near(params(spec), 7.61e9)
    # 28 × 2 × 4 × 128 × 2 B = 57,344; use_sliding_window false: no window
    assert spec.kv_bytes_per_token == 57_344
    assert spec.sliding_window is None and spec.kv_layers is None
    # 2 × 7,615,616,512
    assert spec.flops_per_token == pytest.approx(15_231_233_024, rel=1e-12)


def test_mixtral_8x7b() -> None:
    spec = load("mixtral-8x7b")
    # embeddings 32000 × 4096 = 131,072,000, untied: 262,144,000
    # per layer: attention 41,943,040 (as Llama 3.1 8B); an expert 3×4096×14336 =
    #   176,160,768, 8 of them 1,409,286,144; router 4096×8 = 32,768; norms 8,192
    #   → 1,451,270,144
    # 32 layers 46,440,644,608 + 262,144,000 + 4,096 = 46,702,792,704 (Mistral: 46.7 B)
    assert params(spec) == 46_702_792_704 and near(params(spec), 46.7e9)
    # 6 of 8 experts idle per token: 6 × 32 × 176,160,768 = 33,822,867,456
    # 46,702,792,704 − 33,822,867,456 = 12,879,925,248 (Mistral: 12.9 B)
    assert active(spec) == 12_879_925_248 and near(active(spec), 12.9e9)
    assert spec.kv_bytes_per_token == 131_072  # 32 × 2 × 8 × 128 × 2 B
    # FLOPs from the active parameters: 2 × 12,879,925,248
    assert spec.flops_per_token == pytest.approx(25_759_850_496, rel=1e-12)
    # memory from all of them, BF16: 2 × 46,702,792,704
    assert spec.weight_total_bytes == pytest.approx(93_405_585_408, rel=1e-12)


def test_deepseek_v3() -> None:
    spec = load("deepseek-v3")
    # MLA per layer: q_a 7168×1536 = 11,010,048; q_a norm 1,536; q_b 1536×128×(128+64) =
    #   37,748,736; kv_a 7168×(512+64) = 4,128,768; kv_a norm 512; kv_b 512×128×(128+128)
    #   = 16,777,216; o 128×128×7168 = 117,440,512 → 187,107,328; norms 2×7168 = 14,336
    # 3 dense layers: MLP 3×7168×18432 = 396,361,728 → 583,483,392 each, 1,750,450,176
    # 58 MoE layers: expert 3×7168×2048 = 44,040,192; 256 routed 11,274,289,152 + 1 shared
    #   44,040,192 + router 7168×256 = 1,835,008 → 11,320,164,352; layer 11,507,286,016;
    #   × 58 = 667,422,588,928
    # embeddings 129280×7168 = 926,679,040, untied 1,853,358,080; final norm 7,168
    # 1,750,450,176 + 667,422,588,928 + 1,853,358,080 + 7,168 = 671,026,404,352
    assert params(spec) == 671_026_404_352 and near(params(spec), 671e9)
    # idle: (256 − 8) × 58 × 44,040,192 = 633,474,121,728 → 37,552,282,624 (DeepSeek: 37 B)
    assert active(spec) == 37_552_282_624 and near(active(spec), 37e9)
    # MLA caches kv_lora_rank + qk_rope_head_dim = 576 per layer: 61 × 576 × 2 B = 70,272
    assert spec.kv_latent_dim == 576 and spec.kv_bytes_per_token == 70_272
    assert spec.flops_per_token == pytest.approx(75_104_565_248, rel=1e-12)  # 2 × active
    # FP8 checkpoint: 1 B × 671,026,404,352
    assert spec.weight_bytes == 1.0
    assert spec.weight_total_bytes == pytest.approx(671_026_404_352, rel=1e-12)


def test_gpt_oss_120b() -> None:
    spec = load("gpt-oss-120b")
    # attention: q 2880×(64×64) = 11,796,480; k, v 2880×(8×64) = 1,474,560 each;
    #   o 4096×2880 = 11,796,480 → 26,542,080; biases 4096 + 512 + 512 + 2880 = 8,000;
    #   sinks 64 → 26,550,144
    # expert: 3×2880×2880 = 24,883,200 + biases 2×2880 + 2880 = 8,640 → 24,891,840;
    #   128 experts 3,186,155,520; router 2880×128 + 128 = 368,768; norms 5,760
    #   → 3,213,080,192 per layer, × 36 = 115,670,886,912
    # embeddings 201088 × 2880 = 579,133,440, untied 1,158,266,880; final norm 2,880
    # total 116,829,156,672 (OpenAI: 116.83 B)
    assert params(spec) == 116_829_156_672 and near(params(spec), 116.83e9)
    # idle: 124 × 36 × 24,891,840 = 111,117,173,760 → active 5,711,982,912; OpenAI's
    # 5.13 B leaves out the embedding table: 5,711,982,912 − 579,133,440 = 5,132,849,472
    assert active(spec) == 5_711_982_912
    assert near(active(spec) - 579_133_440, 5.13e9)
    # alternating layers: 18 full × 2 × 8 × 64 × 2 B = 36,864; the 18 sliding layers keep
    # at most 128 tokens and are left out
    assert (spec.kv_layers, spec.sliding_window) == (18, 128)
    assert spec.kv_bytes_per_token == 36_864
    assert spec.flops_per_token == pytest.approx(11_423_965_824, rel=1e-12)  # 2 × active
    # MXFP4 experts: 36 × 3,186,155,520 = 114,701,598,720 × 4.25/8 B = 60,935,224,320 B;
    # the rest 2,127,557,952 in BF16 = 4,255,115,904 B; 65,190,340,224 B in all
    assert spec.weight_total_bytes == pytest.approx(65_190_340_224, rel=1e-12)


def test_gemma_3_27b_nested_text_config() -> None:
    spec = load("gemma-3-27b")
    # text_config omits vocab_size: transformers' 262,208 × 5376 = 1,409,630,208, tied
    # per layer: q 5376×(32×128) = 22,020,096; k, v 5376×(16×128) = 11,010,048 each;
    #   o 22,020,096 → 66,060,288; q/k norms 2×128 = 256; MLP 3×5376×21504 =
    #   346,816,512; 4 norms × 5376 = 21,504 → 412,898,560
    # 62 layers 25,599,710,720 + 1,409,630,208 + 5,376 = 27,009,346,304
    # (Google: 27.4 B with the ~0.4 B vision tower, which is not counted)
    assert params(spec) == 27_009_346_304 and near(params(spec), 27.4e9)
    # one global layer in 6: layers 5, 11, ..., 59 = 10; 10 × 2 × 16 × 128 × 2 B = 81,920
    assert (spec.kv_layers, spec.sliding_window) == (10, 1024)
    assert spec.kv_bytes_per_token == 81_920
    assert spec.flops_per_token == pytest.approx(54_018_692_608, rel=1e-12)
    assert (spec.family, spec.max_model_len, spec.weight_bytes) == ("gemma3", 131072, 2.0)


# -- the built-in table ---------------------------------------------------------------------
def test_the_two_original_shapes_are_unchanged() -> None:
    """Simulator outputs depend on these exact numbers."""
    for name, params_b, layers, hidden, kv in (
        ("llama-3.1-8b", 8.03, 32, 4096, 131_072),  # 32 × 2 × 8 × 128 × 2
        ("llama-3.2-3b", 3.21, 28, 3072, 114_688),  # 28 × 2 × 8 × 128 × 2
    ):
        m = MODELS[name]
        shape = (m.params_b, m.layers, m.kv_heads, m.head_dim, m.hidden)
        assert shape == (params_b, layers, 8, 128, hidden)
        assert (m.weight_bytes, m.kv_bytes, m.kv_bytes_per_token) == (1.0, 2.0, kv)
        assert m.flops_per_token == 2 * params_b * 1e9
        assert m.weight_total_bytes == params_b * 1e9 * 1.0
    huge = ModelSpec("huge", 70, 80, 8, 128, 8192, weight_bytes=2)  # positional, as before
    assert huge.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2.0
    assert huge.flops_per_token == 2 * 70 * 1e9


# name: (total, active or None, KV bytes/token, weight bytes per parameter)
BUILTINS = {
    # 80 × (q 67,108,864 + k, v 8,388,608 each + o 67,108,864 + MLP 3×8192×28672 =
    # 704,643,072 + norms 16,384) = 68,452,352,000 + 2 × 128256×8192 + 8,192 (Meta: 70.6 B)
    # KV 80 × 2 × 8 × 128 × 2 = 327,680
    "llama-3.1-70b": (70_553_706_496, None, 327_680, 1.0),
    # 126 × (268,435,456 × 2 + 16,777,216 × 2 + 3×16384×53248 = 2,617,245,696 + 32,768)
    # = 401,650,679,808 + 2 × 128256×16384 + 16,384 (Meta: 405 B); KV 126 × 4096 = 516,096
    "llama-3.1-405b": (405_853_388_800, None, 516_096, 1.0),
    "qwen2.5-7b": (7_615_616_512, None, 57_344, 1.0),  # test_qwen2_5_7b
    # 36 × (41,943,040 + q/k norms 256 + 3×4096×12288 = 150,994,944 + 8,192) =
    # 6,946,071,552 + 2 × 151936×4096 + 4,096 (Qwen: 8.2 B); KV 36 × 2 × 8 × 128 × 2
    "qwen3-8b": (8_190_735_360, None, 147_456, 1.0),
    # 48 × (attention 2048×4096 × 2 + 2048×512 × 2 = 18,874,368 + 256 + 128 experts ×
    # 3×2048×768 = 603,979,776 + router 262,144 + 4,096) + 2 × 151936×2048 + 2,048
    # = 30,532,122,624 (Qwen: 30.5 B); active: − 120 × 48 × 4,718,592 = 3,353,032,704
    # (Qwen: 3.3 B); KV 48 × 2 × 4 × 128 × 2 = 98,304
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704, 98_304, 1.0),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248, 131_072, 1.0),  # test_mixtral_8x7b
    "deepseek-v3": (671_026_404_352, 37_552_282_624, 70_272, 1.0),  # test_deepseek_v3
    # 24 × (26,550,144 + 32 × 24,891,840 + router 2880×32 + 32 + 5,760) + 1,158,266,880
    # + 2,880 = 20,914,757,184 (OpenAI: 20.91 B); active − 28 × 24 × 24,891,840 =
    # 4,187,440,704 (3.61 B without the 579,133,440 embedding); KV 12 × 2 × 8 × 64 × 2;
    # bytes: 24 × 32 × 24,891,840 = 19,116,933,120 × 4.25/8 = 10,155,870,720, and the other
    # 1,797,824,064 params × 2 = 3,595,648,128: 13,751,518,848
    "gpt-oss-20b": (20_914_757_184, 4_187_440_704, 24_576, 13_751_518_848 / 20_914_757_184),
    "gpt-oss-120b": (116_829_156_672, 5_711_982_912, 36_864, 65_190_340_224 / 116_829_156_672),
    # 42 × (q, o 3584×4096 × 2 + k, v 3584×2048 × 2 = 44,040,192 + MLP 154,140,672 + 4 norms
    # 14,336) + tied 256000×3584 + 3,584 = 9,241,705,984 (Google: 9.24 B); KV: 21 global
    # layers (odd ones) × 2 × 8 × 256 × 2 = 172,032
    "gemma-2-9b": (9_241_705_984, None, 172_032, 1.0),
}


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin(name: str) -> None:
    total, moe_active, kv, weight_bytes = BUILTINS[name]
    m = MODELS[name]
    assert params(m) == total
    assert (m.active_params_b is None) == (moe_active is None)
    assert active(m) == (moe_active or total)
    assert m.kv_bytes_per_token == kv
    assert m.weight_bytes == pytest.approx(weight_bytes, rel=1e-12)
    assert m.flops_per_token == pytest.approx(2 * (moe_active or total), rel=1e-12)
    assert m.name in m.describe()


def test_builtins_agree_with_the_fixture_files() -> None:
    """The embedded dicts hold the same shape as the public config.json files."""
    for name in ("qwen2.5-7b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"):
        from_file = load(name)
        assert replace(from_file, weight_bytes=MODELS[name].weight_bytes) == MODELS[name]


def test_every_builtin_runs_in_the_engine_model() -> None:
    for m in MODELS.values():
        tp = 8 if m.weight_total_bytes > 100e9 else 1
        engine = EngineParams(GPU_SPECS["H200"], m, tp=tp)
        assert engine.kv_capacity_tokens > 0, m.name


def test_builtin_or_error_lists_the_shapes() -> None:
    assert builtin_or_error("gemma-2-9b") is MODELS["gemma-2-9b"]
    with pytest.raises(ValueError, match=r"unknown model shape 'llama-9'; known: llama-3.1-8b"):
        builtin_or_error("llama-9")


# -- errors name the file and the key -------------------------------------------------------
def write(tmp_path: Path, text: str, name: str = "llama.json") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def llama_without(key: str) -> str:
    config = json.loads((FIXTURES / "llama-3.1-8b.json").read_text())
    del config[key]
    return json.dumps(config)


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "nope.json"
    with pytest.raises(ModelConfigError, match=re.escape(f"{missing}: file not found")):
        load_hf_config(missing)


def test_invalid_json(tmp_path: Path) -> None:
    path = write(tmp_path, '{"model_type": "llama",')
    with pytest.raises(ModelConfigError, match=re.escape(f"{path}: invalid JSON")):
        load_hf_config(path)
    path = write(tmp_path, "[1, 2]")
    with pytest.raises(ModelConfigError, match=re.escape(f"{path}: expected a JSON object")):
        load_hf_config(path)


def test_unknown_model_type(tmp_path: Path) -> None:
    path = write(tmp_path, '{"model_type": "mamba"}')
    expected = f"{path}: model_type: unsupported 'mamba'; supported: deepseek_v2"
    with pytest.raises(ModelConfigError, match=re.escape(expected)):
        load_hf_config(path)


@pytest.mark.parametrize("key", ["num_key_value_heads", "vocab_size", "model_type"])
def test_missing_key(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, llama_without(key))
    with pytest.raises(ModelConfigError, match=re.escape(f"{path}: {key}: missing")):
        load_hf_config(path)


def test_missing_key_under_text_config(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "gemma-3-27b.json").read_text())
    del config["text_config"]["hidden_size"]
    path = write(tmp_path, json.dumps(config), "gemma.json")
    with pytest.raises(ModelConfigError, match=re.escape(f"{path}: text_config.hidden_size:")):
        load_hf_config(path)


def test_wrong_values_name_the_key(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "llama-3.1-8b.json").read_text())
    bad = {"num_hidden_layers": "32", "torch_dtype": "int3", "tie_word_embeddings": "no"}
    for key, value in bad.items():
        path = write(tmp_path, json.dumps({**config, key: value}))
        with pytest.raises(ModelConfigError, match=re.escape(f"{path}: {key}: ")):
            load_hf_config(path)
    with pytest.raises(ModelConfigError, match=r"^built-in x: layer_types: expected a list of 36"):
        model_spec_from_hf_config(
            "x", {**json.loads((FIXTURES / "gpt-oss-120b.json").read_text()), "layer_types": []},
            source="built-in x",
        )  # fmt: skip


def test_a_model_directory_is_read_and_named_after_itself(tmp_path: Path) -> None:
    snapshot = tmp_path / "Mixtral-8x7B-Instruct-v0.1"
    snapshot.mkdir()
    (snapshot / "config.json").write_text((FIXTURES / "mixtral-8x7b.json").read_text())
    spec = load_hf_config(snapshot)
    assert spec.name == "Mixtral-8x7B-Instruct-v0.1" and params(spec) == 46_702_792_704


# -- [[models]] tables -----------------------------------------------------------------------
def shape(**table: object) -> ModelShapeConfig:
    return validate("router.toml", dict(table), ModelShapeConfig)


def test_a_builtin_shape_takes_the_tables_name_and_dtypes() -> None:
    spec = shape(shape="mixtral-8x7b", weight_dtype="bf16", kv_cache_dtype="fp8").spec(
        "mixtral", Path("/nowhere")
    )
    assert spec.name == "mixtral" and (spec.weight_bytes, spec.kv_bytes) == (2.0, 1.0)
    assert spec.kv_bytes_per_token == 65_536  # 32 × 2 × 8 × 128 × 1 B
    assert shape(shape="llama-3.1-8b").spec("x", Path(".")) == replace(
        MODELS["llama-3.1-8b"], name="x"
    )


def test_config_json_is_relative_to_the_config_files_directory() -> None:
    table = shape(config_json="hf_configs/gpt-oss-120b.json", weight_dtype="fp8")
    spec = table.spec("gpt-oss", FIXTURES.parent)
    assert spec.name == "gpt-oss" and spec.weight_bytes == 1.0 and spec.kv_bytes == 2.0
    assert params(spec) == 116_829_156_672


def test_config_json_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "llama.json").write_text(llama_without("num_key_value_heads"))
    table = shape(config_json="llama.json")
    expected = f"{tmp_path / 'llama.json'}: num_key_value_heads: missing"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        table.spec("llama", tmp_path)


def test_explicit_fields() -> None:
    spec = shape(
        params_b=100, active_params_b=10, layers=40, hidden=4096, kv_latent_dim=576,
        kv_layers=30, max_model_len=65536, weight_dtype="int4", kv_cache_dtype="fp8",
    ).spec("mine", Path("."))  # fmt: skip
    assert spec.kv_bytes_per_token == 30 * 576 * 1.0  # 17,280
    assert spec.flops_per_token == 2 * 10 * 1e9
    assert spec.weight_total_bytes == 100e9 * 0.5
    gqa = shape(params_b=8, layers=32, hidden=4096, kv_heads=8, head_dim=128).spec("g", Path("."))
    assert gqa.kv_bytes_per_token == 131_072 and gqa.weight_bytes == 1.0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"shape": "llama-3.1-8b", "config_json": "m.json"}, "got `shape` and `config_json`"),
        ({"shape": "qwen3-8b", "layers": 4}, "got `shape` and explicit fields (layers)"),
        ({}, "give exactly one of `shape`"),
        ({"shape": "llama-9"}, "unknown model shape 'llama-9'"),
        ({"params_b": 8, "hidden": 4096, "kv_heads": 8, "head_dim": 128}, "missing `layers`"),
        ({"params_b": 8, "layers": 2, "hidden": 64, "kv_heads": 8}, "`kv_latent_dim`"),
        ({"config_json": "m.json", "weight_dtype": "fp4"}, "weight_dtype: Input should be"),
        ({"shape": "qwen3-8b", "size": 8}, "size: unknown key"),
    ],
)
def test_table_errors_name_the_file_and_the_keys(table: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^router\.toml: ") as caught:
        shape(**table)
    assert message in str(caught.value)


def test_every_key_is_in_the_docs() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    section = text[text.index("## Model shapes ") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    missing = [k for k in ModelShapeConfig.model_fields if f"`{k}`" not in section]
    assert not missing


# -- properties -------------------------------------------------------------------------------
LLAMA = json.loads((FIXTURES / "llama-3.1-8b.json").read_text())


@given(st.integers(1, 200))
def test_kv_bytes_grow_linearly_with_layers(layers: int) -> None:
    spec = model_spec_from_hf_config("l", {**LLAMA, "num_hidden_layers": layers})
    assert spec.kv_bytes_per_token == layers * 4096  # 2 × 8 heads × 128 × 2 B per layer


@given(st.lists(st.booleans(), min_size=1, max_size=64))
def test_only_full_attention_layers_hold_growing_kv(slides: list[bool]) -> None:
    types = ["sliding_attention" if s else "full_attention" for s in slides]
    config = {**LLAMA, "num_hidden_layers": len(slides), "layer_types": types}
    spec = model_spec_from_hf_config("l", {**config, "sliding_window": 512})
    full = slides.count(False) or len(slides)  # every layer sliding: all are counted
    assert spec.kv_bytes_per_token == full * 4096


@given(st.integers(1, 64), st.data())
def test_active_parameters_grow_with_the_experts_chosen(experts: int, data: st.DataObject) -> None:
    chosen = data.draw(st.integers(1, experts))
    mixtral = json.loads((FIXTURES / "mixtral-8x7b.json").read_text())
    config = {**mixtral, "num_local_experts": experts, "num_experts_per_tok": chosen}
    spec = model_spec_from_hf_config("m", config)
    # each unchosen expert per layer: 32 layers × 176,160,768
    assert active(spec) == params(spec) - (experts - chosen) * 32 * 176_160_768
