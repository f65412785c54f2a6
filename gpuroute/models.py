"""Served-model shapes: what the engine model needs to know about a model's size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params_b: float  # billions of parameters
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    weight_bytes: float = 1.0  # 8-bit weights (FP8 / INT8 weight-only) by default
    kv_bytes: float = 2.0  # FP16 KV cache

    @property
    def weight_total_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @property
    def flops_per_token(self) -> float:
        return 2 * self.params_b * 1e9


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Llama 3.1 8B: 32 layers, GQA with 8 KV heads of 128, hidden 4096.
        ModelSpec("llama-3.1-8b", params_b=8.03, layers=32, kv_heads=8, head_dim=128, hidden=4096),
        # Llama 3.2 3B: 28 layers, 8 KV heads of 128, hidden 3072.
        ModelSpec("llama-3.2-3b", params_b=3.21, layers=28, kv_heads=8, head_dim=128, hidden=3072),
    )
}
DEFAULT_MODEL = "llama-3.1-8b"
