"""The fake engine's settings (testbed/fake_engine/server.py), checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.gpus import GPU_SPECS, GpuSpec
from gpuroute.models import MODELS, ModelSpec
from gpuroute.roofline import EngineParams


@dataclass
class FakeEngineConfig:
    gpu: str = "H100"
    model: str = "llama-3.1-8b"
    served_name: str | None = None  # name in the API; defaults to `model`
    host: str = "127.0.0.1"
    port: int = 8000
    time_scale: float = 1.0  # >1 runs the engine that many times slower than the GPU
    default_output_tokens: int = 128
    stream_interval_s: float = 0.02  # at most one SSE chunk per stream per interval
    # relay benchmarks: one token per SSE event, this far apart, whatever the model says
    token_interval_s: float | None = None
    seed: int = 0
    # a GPU type or model shape not in the built-in tables (`gpu` / `model` become their
    # names): a declared [[gpu_types]] entry, a [[models]] shape (testbed/engine_specs.py)
    gpu_spec: GpuSpec | None = None
    model_spec: ModelSpec | None = None
    tensor_parallel: int = 1  # GPUs the engine spans (weights, KV and compute split)

    def __post_init__(self) -> None:
        if self.gpu_spec is not None:
            self.gpu = self.gpu_spec.name
        elif self.gpu not in GPU_SPECS:
            raise ValueError(f"unknown GPU type {self.gpu!r}; known: {', '.join(GPU_SPECS)}")
        if self.model_spec is not None:
            self.model = self.model_spec.name
        elif self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if self.time_scale <= 0 or self.stream_interval_s < 0:
            raise ValueError("time_scale must be > 0 and stream_interval_s >= 0")
        if self.token_interval_s is not None and self.token_interval_s <= 0:
            raise ValueError("token_interval_s must be > 0")
        if not 1 <= self.tensor_parallel <= 64:
            raise ValueError("tensor_parallel must be in 1..64")
        self.engine_params()  # ValueError now if the model does not fit

    def engine_params(self) -> EngineParams:
        """The engine's speeds: its GPU type × tensor parallel degree running its shape."""
        gpu = self.gpu_spec or GPU_SPECS[self.gpu]
        model = self.model_spec or MODELS[self.model]
        return EngineParams(gpu, model, tp=self.tensor_parallel)
