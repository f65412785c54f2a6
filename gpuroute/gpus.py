"""GPU hardware facts: the vocabulary config files are checked against, and the numbers the
engine model (sim/engine_model.py) turns into prefill and decode speeds.

Sources, NVIDIA data sheets (dense tensor throughput, i.e. without 2:4 sparsity):
- H100 SXM5 80 GB: 3.35 TB/s HBM3, 989 TFLOPS BF16/FP16, 700 W.
  (nvidia.com/en-us/data-center/h100, "H100 Tensor Core GPU Datasheet")
- A100 SXM4 80 GB: 2.039 TB/s HBM2e, 312 TFLOPS BF16/FP16, 400 W.
  ("NVIDIA A100 Tensor Core GPU Datasheet", 2021)
- L4 24 GB: 300 GB/s GDDR6, 121 TFLOPS FP16 (242 with sparsity), 72 W. ("NVIDIA L4 datasheet")
- T4 16 GB: 320 GB/s GDDR6, 65 TFLOPS FP16 mixed precision, 70 W. ("NVIDIA T4 datasheet")
- V100 SXM2 32 GB: 900 GB/s HBM2, 125 TFLOPS tensor, 300 W. ("NVIDIA V100 datasheet", 2020)
Decode is memory-bound (bandwidth ratio H100:A100:L4 ≈ 11:7:1), prefill compute-bound
(≈ 8:2.6:1); the engine model keeps the two apart for that reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

from gpuroute.config import known_name


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_gb: float
    memory_bandwidth_tbs: float
    fp16_tflops: float
    tdp_w: float


GPU_SPECS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("H100", memory_gb=80, memory_bandwidth_tbs=3.35, fp16_tflops=989, tdp_w=700),
        GpuSpec("A100", memory_gb=80, memory_bandwidth_tbs=2.039, fp16_tflops=312, tdp_w=400),
        GpuSpec("L4", memory_gb=24, memory_bandwidth_tbs=0.300, fp16_tflops=121, tdp_w=72),
        GpuSpec("T4", memory_gb=16, memory_bandwidth_tbs=0.320, fp16_tflops=65, tdp_w=70),
        GpuSpec("V100", memory_gb=32, memory_bandwidth_tbs=0.900, fp16_tflops=125, tdp_w=300),
    )
}
GPU_TYPES: tuple[str, ...] = tuple(GPU_SPECS)

GpuTypeName = Annotated[str, AfterValidator(lambda v: known_name(v, GPU_TYPES, "GPU type"))]
