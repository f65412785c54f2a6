"""Model shapes from a Hugging Face config.json: parameters, KV-cache layout and weight bytes
worked out from the architecture, so serving a new model needs no hand-copied numbers.

Counted: embeddings (and an untied lm_head), attention projections with their biases, the
MLP or the routed experts with their router and shared experts, norms. Not counted: vision
towers of multimodal checkpoints, DeepSeek's multi-token-prediction layer (only speculative
decoding uses it), quantization scales. docs/configuration.md (Model shapes) lists the
approximations."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuroute.config import ConfigError

MXFP4_BYTES = 4.25 / 8  # 4-bit values and one 8-bit scale per block of 32: 4.25 bits
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
_REQUIRED: Any = object()


class ModelConfigError(ConfigError):
    """A config.json that does not describe a model we can size; names the file and key."""


@dataclass(frozen=True, slots=True)
class Family:
    """What a model_type's config.json leaves unsaid: layout facts its keys do not state."""

    name: str
    tied: bool = False  # tie_word_embeddings when the file omits it
    norms_per_layer: int = 2
    qkv_bias: bool = False  # Qwen2: biases on q, k and v
    attention_bias: bool = False  # attention_bias when the file omits it (q, k, v and o)
    qk_norm: bool = False  # Qwen3, Gemma 3: an RMSNorm over each q and k head
    sinks: bool = False  # gpt-oss: one learned attention sink per head
    moe: str | None = None  # how its experts are laid out: a key of EXPERT_KEYS
    windows: str = "none"  # which layers slide when there is no layer_types: see _slides
    defaults: tuple[tuple[str, Any], ...] = ()  # keys its files omit, transformers' defaults


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama"),
        Family("mistral", windows="all"),
        Family("mixtral", moe="mixtral", windows="all"),
        Family("qwen2", qkv_bias=True, windows="qwen"),
        Family("qwen3", qk_norm=True, windows="qwen"),
        Family("qwen3_moe", qk_norm=True, moe="qwen3_moe", windows="qwen"),
        Family("deepseek_v2", moe="deepseek"),
        Family("deepseek_v3", moe="deepseek"),
        Family("gpt_oss", attention_bias=True, sinks=True, moe="gpt_oss"),
        Family("gemma", tied=True),
        Family("gemma2", tied=True, norms_per_layer=4, windows="alternate"),
        Family(
            "gemma3_text", tied=True, norms_per_layer=4, qk_norm=True, windows="every_nth",
            defaults=(
                ("vocab_size", 262_208), ("max_position_embeddings", 131_072),
                ("sliding_window_pattern", 6),
            ),
        ),
    )
}  # fmt: skip
# multimodal wrappers: the language model's config sits under text_config
WRAPPERS = {"gemma3": "gemma3_text"}
# (experts, size of one expert's MLP) per expert layout
EXPERT_KEYS = {
    "mixtral": ("num_local_experts", "intermediate_size"),
    "qwen3_moe": ("num_experts", "moe_intermediate_size"),
    "deepseek": ("n_routed_experts", "moe_intermediate_size"),
    "gpt_oss": ("num_local_experts", "intermediate_size"),
}


class _Keys:
    """One config's keys; every error names the file and the key."""

    def __init__(self, config: Mapping[str, Any], source: str, prefix: str = "") -> None:
        self.config, self.source, self.prefix = config, source, prefix
        self.defaults: dict[str, Any] = {}

    def error(self, key: str, problem: str) -> ModelConfigError:
        return ModelConfigError(f"{self.source}: {self.prefix}{key}: {problem}")

    def get(self, key: str, default: Any = None) -> Any:
        """A key's value; JSON null counts as absent, as transformers reads it."""
        value = self.config.get(key)
        if value is None:
            value = self.defaults.get(key, default)
        if value is _REQUIRED:
            raise self.error(key, "missing")
        return value

    def count(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value


@dataclass(frozen=True, slots=True)
class _Attention:
    params: int  # one layer's projections, biases, q/k norms and sinks
    kv_heads: int
    head_dim: int
    latent: int | None  # MLA: elements cached per token per layer


@dataclass(frozen=True, slots=True)
class _Mlp:
    total: int  # every layer's MLP or experts, with routers and shared experts
    routed: int  # the routed experts alone (what an MXFP4 checkpoint quantizes)
    idle: int  # routed experts a token does not use


def _open(config: Mapping[str, Any], source: str) -> tuple[_Keys, _Keys, Family]:
    """The keys of the language model (under text_config for a wrapper), the file's own keys
    (dtype and quantization live there), and the family."""
    outer = _Keys(config, source)
    model_type = outer.get("model_type", _REQUIRED)
    inner, family_name = outer, model_type
    if model_type in WRAPPERS:
        text = outer.get("text_config", _REQUIRED)
        if not isinstance(text, Mapping):
            raise outer.error("text_config", "expected a table of the language model's keys")
        inner, family_name = _Keys(text, source, "text_config."), WRAPPERS[model_type]
    family = FAMILIES.get(family_name)
    if family is None:
        known = ", ".join(sorted({*FAMILIES, *WRAPPERS}))
        raise outer.error("model_type", f"unsupported {model_type!r}; supported: {known}")
    inner.defaults = dict(family.defaults)
    return inner, outer, family


def _attention(keys: _Keys, family: Family, hidden: int) -> _Attention:
    heads = keys.count("num_attention_heads")
    if family.moe == "deepseek":
        return _latent_attention(keys, hidden, heads)
    kv_heads = keys.count("num_key_value_heads")
    head_dim = keys.count("head_dim", default=hidden // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    params = 2 * hidden * q + 2 * hidden * kv  # q and o; k and v
    if keys.flag("attention_bias", family.attention_bias):
        params += q + 2 * kv + hidden
    elif family.qkv_bias:
        params += q + 2 * kv
    params += 2 * head_dim * family.qk_norm + heads * family.sinks
    return _Attention(params, kv_heads, head_dim, None)


def _latent_attention(keys: _Keys, hidden: int, heads: int) -> _Attention:
    """DeepSeek's MLA: the cache holds one compressed latent and one shared RoPE key."""
    rank, rope = keys.count("kv_lora_rank"), keys.count("qk_rope_head_dim")
    nope, v_dim = keys.count("qk_nope_head_dim"), keys.count("v_head_dim")
    q_rank = keys.count("q_lora_rank", default=None)  # None: q projected directly
    q_dim = heads * (nope + rope)
    q = hidden * q_dim if q_rank is None else hidden * q_rank + q_rank + q_rank * q_dim
    kv = hidden * (rank + rope) + rank + rank * heads * (nope + v_dim)
    return _Attention(q + kv + heads * v_dim * hidden, heads, nope + rope, rank + rope)


def _moe_layers(keys: _Keys, family: Family, layers: int) -> int:
    """How many layers hold experts; the rest have a dense MLP of intermediate_size."""
    if family.moe == "qwen3_moe":
        step = keys.count("decoder_sparse_step", default=1)
        dense = keys.get("mlp_only_layers", [])
        if not isinstance(dense, list):
            raise keys.error("mlp_only_layers", "expected a list of layer numbers")
        return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if family.moe == "deepseek":
        first = keys.count("first_k_dense_replace", default=0, minimum=0)
        every = keys.count("moe_layer_freq", default=1)
        return sum(1 for i in range(first, layers) if i % every == 0)
    return layers


def _mlp(keys: _Keys, family: Family, hidden: int, layers: int) -> _Mlp:
    if family.moe is None:
        return _Mlp(layers * 3 * hidden * keys.count("intermediate_size"), 0, 0)
    experts_key, size_key = EXPERT_KEYS[family.moe]
    experts, size = keys.count(experts_key), keys.count(size_key)
    chosen_key = "num_experts_per_tok"
    if family.moe == "gpt_oss" and keys.get(chosen_key) is None:
        chosen_key = "experts_per_token"
    chosen = keys.count(chosen_key)
    if chosen > experts:
        raise keys.error(chosen_key, f"{chosen} is more than the {experts} experts")
    expert = 3 * hidden * size  # gate, up and down projections
    fixed = hidden * experts  # the router
    if family.moe == "gpt_oss":
        expert += 2 * size + hidden  # biases on gate_up and down
        fixed += experts
    if family.moe == "deepseek":
        fixed += keys.count("n_shared_experts", default=0, minimum=0) * expert
    moe = _moe_layers(keys, family, layers)
    dense = (layers - moe) * 3 * hidden * keys.count("intermediate_size") if moe < layers else 0
    routed = moe * experts * expert
    return _Mlp(dense + routed + moe * fixed, routed, moe * (experts - chosen) * expert)


def _slides(keys: _Keys, family: Family, layers: int) -> list[bool]:
    """Which layers use a sliding window: layer_types where the file has it, else the
    family's fixed pattern (Gemma 2 alternates; Gemma 3 has one global layer in N)."""
    types = keys.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise keys.error("layer_types", f"expected a list of {layers} layer types")
        return [t == "sliding_attention" for t in types]
    if keys.get("sliding_window") is None:
        return [False] * layers
    if family.windows == "all":
        return [True] * layers
    if family.windows == "alternate":
        return [i % 2 == 0 for i in range(layers)]
    if family.windows == "every_nth":
        n = keys.count("sliding_window_pattern")
        return [(i + 1) % n != 0 for i in range(layers)]
    if family.windows == "qwen" and keys.flag("use_sliding_window", False):
        first = keys.count("max_window_layers", minimum=0)
        return [i >= first for i in range(layers)]
    return [False] * layers


def _windows(keys: _Keys, family: Family, layers: int) -> tuple[int | None, int | None]:
    """(kv_layers, sliding_window): sliding layers keep at most the window, so they are left
    out of the per-token KV. When every layer slides (Mistral 7B v0.1) all are counted."""
    sliding = sum(_slides(keys, family, layers))
    if sliding == 0:
        return None, None
    window = keys.count("sliding_window")
    return (None if sliding == layers else layers - sliding), window


def _weight_bytes(keys: _Keys, params: int, routed: int) -> float:
    """Bytes per parameter the checkpoint ships: its dtype, or its quantization's."""
    dtype_key = "torch_dtype" if keys.get("torch_dtype") is not None else "dtype"
    dtype = keys.get(dtype_key, "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise keys.error(dtype_key, f"unsupported {dtype!r}; supported: {', '.join(DTYPE_BYTES)}")
    quant = keys.get("quantization_config")
    if quant is None:
        return DTYPE_BYTES[dtype]
    if not isinstance(quant, Mapping):
        raise keys.error("quantization_config", "expected a table")
    method = quant.get("quant_method")
    if method == "fp8":
        return 1.0
    if method == "mxfp4" and routed:  # the experts; attention, router, embeddings stay
        return (routed * MXFP4_BYTES + (params - routed) * DTYPE_BYTES[dtype]) / params
    if method == "mxfp4":
        return MXFP4_BYTES
    if isinstance(quant.get("bits"), int):  # GPTQ, AWQ
        return quant["bits"] / 8
    raise keys.error("quantization_config", f"unsupported {method!r}; set the weight dtype")


def hf_shape(
    config: Mapping[str, Any], *, weight_bytes: float | None = None, source: str = "config.json"
) -> dict[str, Any]:
    """A parsed config.json's shape: every ModelSpec field but the name and the KV dtype
    (gpuroute/models.py builds the ModelSpec). weight_bytes None: what the checkpoint ships
    (dtype or quantization_config)."""
    keys, outer, family = _open(config, source)
    layers, hidden = keys.count("num_hidden_layers"), keys.count("hidden_size")
    attention = _attention(keys, family, hidden)
    mlp = _mlp(keys, family, hidden, layers)
    embedding = keys.count("vocab_size") * hidden
    lm_head = 0 if keys.flag("tie_word_embeddings", family.tied) else embedding
    per_layer = attention.params + family.norms_per_layer * hidden
    total = embedding + lm_head + hidden + layers * per_layer + mlp.total
    kv_layers, window = _windows(keys, family, layers)
    if weight_bytes is None:
        weight_bytes = _weight_bytes(outer, total, mlp.routed)
    return dict(
        params_b=total / 1e9,
        layers=layers,
        kv_heads=attention.kv_heads,
        head_dim=attention.head_dim,
        hidden=hidden,
        weight_bytes=weight_bytes,
        active_params_b=(total - mlp.idle) / 1e9 if family.moe else None,
        kv_latent_dim=attention.latent,
        kv_layers=kv_layers,
        sliding_window=window,
        max_model_len=keys.count("max_position_embeddings", default=None),
        family=outer.get("model_type"),
    )


def read_hf_config(path: Path | str) -> tuple[str, dict[str, Any], str]:
    """Read a config.json (or a model directory holding one): the model's default name
    (the directory's for a config.json, a Hugging Face snapshot; else the file's stem), the
    parsed settings, and where they came from."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path}: expected a JSON object of model settings")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return name, config, str(path)
