"""Served-model shapes: what the engine model needs to know about a model's size, from the
built-in table, a Hugging Face config.json, or numbers a config file gives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from gpuroute.config import StrictModel
from gpuroute.hf_config import MXFP4_BYTES, hf_shape, read_hf_config


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model's size as the engine model reads it: memory holds every parameter, a token's
    FLOPs use only the active ones (MoE), and the KV cache grows only in the layers that
    attend to the whole context (sliding-window layers keep a bounded window)."""

    name: str
    params_b: float  # billions of parameters, every expert included
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    weight_bytes: float = 1.0  # 8-bit weights (FP8 / INT8 weight-only) by default
    kv_bytes: float = 2.0  # FP16 KV cache
    active_params_b: float | None = None  # MoE: billions a token uses; None: params_b
    kv_latent_dim: int | None = None  # MLA: elements cached per token per layer
    kv_layers: int | None = None  # layers whose KV grows with the context; None: all
    sliding_window: int | None = None  # tokens the other layers keep
    max_model_len: int | None = None  # max_position_embeddings
    family: str = "llama"  # informational: the config.json's model_type

    def __post_init__(self) -> None:
        if self.kv_layers is not None and not 0 <= self.kv_layers <= self.layers:
            raise ValueError(f"{self.name}: kv_layers {self.kv_layers} not in 0..{self.layers}")
        if self.active_params_b is not None and self.active_params_b > self.params_b:
            raise ValueError(f"{self.name}: more active parameters than parameters")

    @property
    def weight_total_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        layers = self.layers if self.kv_layers is None else self.kv_layers
        per_layer = self.kv_latent_dim
        if per_layer is None:
            per_layer = 2 * self.kv_heads * self.head_dim  # a key and a value per KV head
        return layers * per_layer * self.kv_bytes

    @property
    def flops_per_token(self) -> float:
        active = self.params_b if self.active_params_b is None else self.active_params_b
        return 2 * active * 1e9

    def describe(self) -> str:
        """One line for CLI output."""
        active = "" if self.active_params_b is None else f" ({self.active_params_b:.1f} B active)"
        window = f", window {self.sliding_window}" if self.kv_layers is not None else ""
        return (
            f"{self.name}: {self.params_b:.1f} B params{active}, {self.layers} layers, "
            f"{self.weight_total_bytes / 1e9:.1f} GB weights, "
            f"{self.kv_bytes_per_token / 1024:.1f} KiB KV/token{window}"
        )


def model_spec_from_hf_config(
    name: str,
    config: Mapping[str, Any],
    *,
    weight_bytes: float | None = None,
    kv_bytes: float = 2.0,
    source: str = "config.json",
) -> ModelSpec:
    """A ModelSpec from a parsed config.json (gpuroute/hf_config.py works out the shape).
    weight_bytes None: what the checkpoint ships; kv_bytes: the KV cache's dtype, 2 for
    FP16/BF16."""
    shape = hf_shape(config, weight_bytes=weight_bytes, source=source)
    return ModelSpec(name, kv_bytes=kv_bytes, **shape)


def load_hf_config(
    path: Path | str,
    *,
    name: str | None = None,
    weight_bytes: float | None = None,
    kv_bytes: float = 2.0,
) -> ModelSpec:
    """The ModelSpec of a config.json (or a model directory holding one). name None: the
    directory's name for a config.json (a Hugging Face snapshot), else the file's stem."""
    default, config, source = read_hf_config(path)
    return model_spec_from_hf_config(
        default if name is None else name,
        config,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        source=source,
    )


def _builtin(name: str, config: dict[str, Any], weight_bytes: float | None = 1.0) -> ModelSpec:
    """A built-in from its public config.json; weight_bytes None: the checkpoint's own."""
    return model_spec_from_hf_config(
        name, config, weight_bytes=weight_bytes, source=f"built-in model {name}"
    )


# The shape-bearing fields of each model's public config.json (Hugging Face repo in the comment)
# meta-llama/Llama-3.1-70B-Instruct
_LLAMA_31_70B = {
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# meta-llama/Llama-3.1-405B-Instruct
_LLAMA_31_405B = {
    **_LLAMA_31_70B, "hidden_size": 16384, "intermediate_size": 53248,
    "num_hidden_layers": 126, "num_attention_heads": 128,
}  # fmt: skip
# Qwen/Qwen2.5-7B-Instruct
_QWEN25_7B = {
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "max_position_embeddings": 32768, "sliding_window": 131072,
    "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# Qwen/Qwen3-8B
_QWEN3_8B = {
    "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# Qwen/Qwen3-30B-A3B
_QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# mistralai/Mixtral-8x7B-Instruct-v0.1
_MIXTRAL_8X7B = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_local_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 32768, "sliding_window": None, "torch_dtype": "bfloat16",
}  # fmt: skip
# deepseek-ai/DeepSeek-V3 (ships FP8 weights, 128x128 block scales)
_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}  # fmt: skip
# openai/gpt-oss-20b (ships MXFP4 experts; attention, router and embeddings in BF16)
_GPT_OSS_20B = {
    "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_local_experts": 32, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "attention_bias": True, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "vocab_size": 201088,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "mxfp4"},
}  # fmt: skip
# openai/gpt-oss-120b
_GPT_OSS_120B = {
    **_GPT_OSS_20B, "num_local_experts": 128, "num_hidden_layers": 36,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}  # fmt: skip
# google/gemma-2-9b
_GEMMA2_9B = {
    "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
    "sliding_window": 4096, "torch_dtype": "float32",
}  # fmt: skip

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Llama 3.1 8B: 32 layers, GQA with 8 KV heads of 128, hidden 4096.
        ModelSpec(
            "llama-3.1-8b",
            params_b=8.03,
            layers=32,
            kv_heads=8,
            head_dim=128,
            hidden=4096,
            max_model_len=131072,
        ),
        # Llama 3.2 3B: 28 layers, 8 KV heads of 128, hidden 3072.
        ModelSpec(
            "llama-3.2-3b",
            params_b=3.21,
            layers=28,
            kv_heads=8,
            head_dim=128,
            hidden=3072,
            max_model_len=131072,
        ),
        # Served with 8-bit weights (as the two above) unless the checkpoint ships its own.
        _builtin("llama-3.1-70b", _LLAMA_31_70B),
        _builtin("llama-3.1-405b", _LLAMA_31_405B),
        _builtin("qwen2.5-7b", _QWEN25_7B),
        _builtin("qwen3-8b", _QWEN3_8B),
        _builtin("qwen3-30b-a3b", _QWEN3_30B_A3B),
        _builtin("mixtral-8x7b", _MIXTRAL_8X7B),
        _builtin("deepseek-v3", _DEEPSEEK_V3, weight_bytes=None),
        _builtin("gpt-oss-20b", _GPT_OSS_20B, weight_bytes=None),
        _builtin("gpt-oss-120b", _GPT_OSS_120B, weight_bytes=None),
        _builtin("gemma-2-9b", _GEMMA2_9B),
    )
}
DEFAULT_MODEL = "llama-3.1-8b"


def builtin_or_error(name: str) -> ModelSpec:
    """A built-in shape; the error lists them all, for whoever reads the config file."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(MODELS)}") from None


WeightDtype = Literal["fp16", "bf16", "fp8", "int8", "int4", "mxfp4"]
KvCacheDtype = Literal["auto", "fp16", "bf16", "fp8"]
WEIGHT_DTYPE_BYTES: dict[str, float] = {
    "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "mxfp4": MXFP4_BYTES,
}  # fmt: skip
KV_CACHE_DTYPE_BYTES: dict[str, float] = {"auto": 2.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
EXPLICIT_FIELDS = (
    "params_b", "active_params_b", "layers", "hidden", "kv_heads", "head_dim",
    "kv_latent_dim", "kv_layers", "max_model_len",
)  # fmt: skip


class ModelShapeConfig(StrictModel):
    """A served model's shape in a config file: a built-in (`shape`), a Hugging Face
    config.json (`config_json`), or the numbers themselves."""

    shape: str | None = None
    config_json: str | None = None  # relative to the config file's directory
    params_b: float | None = Field(default=None, gt=0)
    active_params_b: float | None = Field(default=None, gt=0)
    layers: int | None = Field(default=None, ge=1)
    hidden: int | None = Field(default=None, ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    kv_latent_dim: int | None = Field(default=None, ge=1)
    kv_layers: int | None = Field(default=None, ge=0)
    max_model_len: int | None = Field(default=None, ge=1)
    weight_dtype: WeightDtype | None = None
    kv_cache_dtype: KvCacheDtype = "auto"

    @model_validator(mode="after")
    def _one_source(self) -> ModelShapeConfig:
        explicit = [k for k in EXPLICIT_FIELDS if getattr(self, k) is not None]
        given = [
            what
            for what, on in (
                ("`shape`", self.shape is not None),
                ("`config_json`", self.config_json is not None),
                (f"explicit fields ({', '.join(explicit)})", bool(explicit)),
            )
            if on
        ]
        if len(given) != 1:
            found = f"; got {' and '.join(given)}" if given else ""
            raise ValueError(
                "give exactly one of `shape` (a built-in), `config_json` (a Hugging Face "
                f"config.json) or explicit fields (`params_b`, `layers`, ...){found}"
            )
        if self.shape is not None:
            builtin_or_error(self.shape)
        if explicit:
            self._check_explicit()
        return self

    def _check_explicit(self) -> None:
        missing = [k for k in ("params_b", "layers", "hidden") if getattr(self, k) is None]
        if missing:
            raise ValueError(f"an explicit shape needs `params_b`, `layers` and `hidden`: "
                             f"missing {', '.join(f'`{k}`' for k in missing)}")  # fmt: skip
        if self.kv_latent_dim is None and (self.kv_heads is None or self.head_dim is None):
            raise ValueError(
                "an explicit shape needs `kv_heads` and `head_dim`, or `kv_latent_dim`"
            )
        if self.active_params_b is not None and self.active_params_b > self.params_b:
            raise ValueError("`active_params_b` is more than `params_b`")
        if self.kv_layers is not None and self.kv_layers > self.layers:
            raise ValueError("`kv_layers` is more than `layers`")

    def spec(self, name: str, base_dir: Path) -> ModelSpec:
        """The shape, named `name`; a config_json is read now (ModelConfigError if it can't)."""
        weight_bytes = None if self.weight_dtype is None else WEIGHT_DTYPE_BYTES[self.weight_dtype]
        kv_bytes = KV_CACHE_DTYPE_BYTES[self.kv_cache_dtype]
        if self.config_json is not None:
            return load_hf_config(
                Path(base_dir) / self.config_json,
                name=name, weight_bytes=weight_bytes, kv_bytes=kv_bytes,
            )  # fmt: skip
        if self.shape is not None:
            changes: dict[str, Any] = {"name": name}
            if weight_bytes is not None:
                changes["weight_bytes"] = weight_bytes
            if self.kv_cache_dtype != "auto":
                changes["kv_bytes"] = kv_bytes
            return replace(builtin_or_error(self.shape), **changes)
        assert self.params_b is not None and self.layers is not None and self.hidden is not None
        return ModelSpec(
            name, params_b=self.params_b, layers=self.layers, kv_heads=self.kv_heads or 0,
            head_dim=self.head_dim or 0, hidden=self.hidden,
            weight_bytes=1.0 if weight_bytes is None else weight_bytes, kv_bytes=kv_bytes,
            active_params_b=self.active_params_b, kv_latent_dim=self.kv_latent_dim,
            kv_layers=self.kv_layers, max_model_len=self.max_model_len, family="explicit",
        )  # fmt: skip
