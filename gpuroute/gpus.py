"""GPU hardware facts: the vocabulary config files are checked against, and the numbers the
engine model (sim/engine_model.py) turns into prefill and decode speeds.

Sources, vendors' data sheets (dense tensor throughput, i.e. without 2:4 sparsity; where a
sheet gives only the sparse figure or a platform's, the per-GPU dense figure is half of it or
the platform's divided by its GPUs):
- H100 SXM5 80 GB: 3.35 TB/s HBM3, 989 TFLOPS BF16/FP16, 1,979 FP8, 700 W.
  (nvidia.com/en-us/data-center/h100, "H100 Tensor Core GPU Datasheet")
- H200 SXM 141 GB: 4.8 TB/s HBM3e, 989 TFLOPS BF16, 1,979 FP8, 700 W. ("NVIDIA H200 datasheet")
- H20 96 GB: 4.0 TB/s HBM3, 148 TFLOPS BF16, 296 FP8, 400 W. (NVIDIA H20 product brief, 2024)
- B200 (HGX B200, per GPU) 180 GB: 7.7 TB/s HBM3e, 2,250 TFLOPS BF16, 4,500 FP8, 1,000 W.
  ("NVIDIA HGX B200 datasheet": 1.44 TB, 62 TB/s, 18 PFLOPS FP16 sparse over 8 GPUs)
- GB200 (per Blackwell GPU of a GB200 NVL72) 186 GB: 8 TB/s, 2,500 TFLOPS BF16, 5,000 FP8,
  1,200 W. ("NVIDIA GB200 NVL72": 13.4 TB, 576 TB/s, 360 PFLOPS FP16 sparse over 72 GPUs)
- A100 SXM4 80 GB: 2.039 TB/s HBM2e, 312 TFLOPS BF16/FP16, 400 W.
  ("NVIDIA A100 Tensor Core GPU Datasheet", 2021)
- L40S 48 GB: 864 GB/s GDDR6, 362 TFLOPS BF16, 733 FP8, 350 W. ("NVIDIA L40S datasheet")
- L40 48 GB: 864 GB/s GDDR6, 181 TFLOPS FP16, 362 FP8, 300 W. ("NVIDIA L40 datasheet")
- RTX 6000 Ada 48 GB: 960 GB/s GDDR6, 364 TFLOPS FP16, 728 FP8, 300 W.
  ("NVIDIA RTX 6000 Ada Generation datasheet": 1,457 TFLOPS FP8 sparse)
- A10 24 GB: 600 GB/s GDDR6, 125 TFLOPS BF16, 150 W. ("NVIDIA A10 datasheet")
- A10G 24 GB (AWS G5): 600 GB/s GDDR6, 70 TFLOPS FP16, 150 W. NVIDIA publishes no A10G
  sheet; memory and bandwidth from AWS's G5 documentation, throughput a reduced A10's.
- L4 24 GB: 300 GB/s GDDR6, 121 TFLOPS FP16 (242 with sparsity), 242 FP8, 72 W.
  ("NVIDIA L4 datasheet")
- T4 16 GB: 320 GB/s GDDR6, 65 TFLOPS FP16 mixed precision, 70 W. ("NVIDIA T4 datasheet")
- V100 SXM2 32 GB: 900 GB/s HBM2, 125 TFLOPS tensor, 300 W. ("NVIDIA V100 datasheet", 2020)
- MI300X 192 GB: 5.3 TB/s HBM3, 1,307 TFLOPS BF16, 2,615 FP8, 750 W. ("AMD Instinct MI300X
  data sheet")
- MI325X 256 GB: 6 TB/s HBM3E, 1,307 TFLOPS BF16, 2,615 FP8, 1,000 W. ("AMD Instinct MI325X
  data sheet")
Decode is memory-bound (bandwidth ratio H100:A100:L4 ≈ 11:7:1), prefill compute-bound
(≈ 8:2.6:1); the engine model keeps the two apart for that reason."""

from __future__ import annotations

import re
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
    fp8_tflops: float | None = None  # None: no FP8 tensor cores


def _spec(name: str, gb: float, tbs: float, fp16: float, watts: float, fp8: float | None = None):
    return GpuSpec(name, gb, tbs, fp16, watts, fp8)


GPU_SPECS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        _spec("H100", 80, 3.35, 989, 700, 1979),
        _spec("A100", 80, 2.039, 312, 400),
        _spec("L4", 24, 0.300, 121, 72, 242),
        _spec("T4", 16, 0.320, 65, 70),
        _spec("V100", 32, 0.900, 125, 300),
        _spec("H200", 141, 4.8, 989, 700, 1979),
        _spec("H20", 96, 4.0, 148, 400, 296),
        _spec("B200", 180, 7.7, 2250, 1000, 4500),
        _spec("GB200", 186, 8.0, 2500, 1200, 5000),
        _spec("L40S", 48, 0.864, 362, 350, 733),
        _spec("L40", 48, 0.864, 181, 300, 362),
        _spec("RTX6000Ada", 48, 0.960, 364, 300, 728),
        _spec("A10", 24, 0.600, 125, 150),
        _spec("A10G", 24, 0.600, 70, 150),
        _spec("MI300X", 192, 5.3, 1307, 750, 2615),
        _spec("MI325X", 256, 6.0, 1307, 1000, 2615),
    )
}
GPU_TYPES: tuple[str, ...] = tuple(GPU_SPECS)

GpuTypeName = Annotated[str, AfterValidator(lambda v: known_name(v, GPU_TYPES, "GPU type"))]

# words NVML and amdsmi put around a GPU's model name, and model names that are variants of
# a type here ("Tesla V100S-PCIE-32GB" is a V100)
_NOISE = frozenset({"NVIDIA", "TESLA", "AMD", "INSTINCT", "RADEON", ""})
_VARIANTS = {"V100S": "V100", "H100NVL": "H100"}


class UnknownGpuName(ValueError):
    """A device name no GPU type here matches."""


def gpu_type_of_device(device_name: str) -> str:
    """The GPU type of a device as NVML (nvmlDeviceGetName) or amdsmi names it:
    "NVIDIA H100 80GB HBM3" → H100, "Tesla T4" → T4, "NVIDIA A100-SXM4-40GB" → A100,
    "AMD Instinct MI300X" → MI300X. UnknownGpuName, saying how to declare it, otherwise."""
    words = [w for w in re.split(r"[\s\-_]+", device_name.strip().upper()) if w not in _NOISE]
    by_upper = {t.upper(): t for t in GPU_TYPES}
    if words[:1] == ["RTX"] and "6000" in words and "ADA" in words:
        return "RTX6000Ada"
    model = _VARIANTS.get(words[0], words[0]) if words else ""
    if model in by_upper:
        return by_upper[model]
    raise UnknownGpuName(
        f"GPU {device_name!r} is none of the known types ({', '.join(GPU_TYPES)}); name its "
        "type with `gpu` in the agent's [[engines]] (one of those), or add it to "
        "gpuroute/gpus.py with its data sheet's memory, bandwidth and FLOPS"
    )
