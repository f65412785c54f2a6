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
Interconnect (per GPU, one direction's share of the all-reduce ring): NVLink 4 900 GB/s
(H100, H200, H20), NVLink 5 1.8 TB/s (B200, GB200), NVLink 3 600 GB/s (A100), NVLink 2
300 GB/s (V100), AMD Infinity Fabric 896 GB/s (MI300X, MI325X: 7 links of 128 GB/s); PCIe-only
cards get PCIe Gen4 x16's 64 GB/s (32 for the Gen3 T4). Prices: rough on-demand $/hour for
one GPU (public cloud list prices, 2024-2025, the GPU's share of its instance); they only rank
types against each other, so set your own (`price_per_hour` in [[gpu_types]], or the
router's [slo] gpu_prices).
Decode is memory-bound (bandwidth ratio H100:A100:L4 ≈ 11:7:1), prefill compute-bound
(≈ 8:2.6:1); the engine model keeps the two apart for that reason."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, get_args

from pydantic import (
    AfterValidator,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from gpuroute.config import StrictModel

# what a GPU type may be called in configs: a word, as NVML's model part ("H100", "L40S")
GPU_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$"
PCIE_GEN4_GBS = 64.0


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_gb: float
    memory_bandwidth_tbs: float
    fp16_tflops: float
    tdp_w: float
    fp8_tflops: float | None = None  # None: no FP8 tensor cores
    interconnect_gbs: float = PCIE_GEN4_GBS  # per GPU, what tensor-parallel all-reduces use
    price_per_hour: float | None = None  # None: the cost score treats it as the median
    device_names: tuple[str, ...] = ()  # what NVML or amdsmi call it, besides the type's name


def _spec(
    name: str, gb: float, tbs: float, fp16: float, watts: float, fp8: float | None,
    link: float, price: float,
) -> GpuSpec:  # fmt: skip
    return GpuSpec(name, gb, tbs, fp16, watts, fp8, link, price)


GPU_SPECS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        _spec("H100", 80, 3.35, 989, 700, 1979, 900, 4.0),
        _spec("A100", 80, 2.039, 312, 400, None, 600, 2.5),
        _spec("L4", 24, 0.300, 121, 72, 242, 64, 0.7),
        _spec("T4", 16, 0.320, 65, 70, None, 32, 0.35),
        _spec("V100", 32, 0.900, 125, 300, None, 300, 1.5),
        _spec("H200", 141, 4.8, 989, 700, 1979, 900, 5.0),
        _spec("H20", 96, 4.0, 148, 400, 296, 900, 2.0),
        _spec("B200", 180, 7.7, 2250, 1000, 4500, 1800, 7.0),
        _spec("GB200", 186, 8.0, 2500, 1200, 5000, 1800, 8.0),
        _spec("L40S", 48, 0.864, 362, 350, 733, 64, 1.6),
        _spec("L40", 48, 0.864, 181, 300, 362, 64, 1.2),
        _spec("RTX6000Ada", 48, 0.960, 364, 300, 728, 64, 1.2),
        _spec("A10", 24, 0.600, 125, 150, None, 64, 0.9),
        _spec("A10G", 24, 0.600, 70, 150, None, 64, 1.0),
        _spec("MI300X", 192, 5.3, 1307, 750, 2615, 896, 4.0),
        _spec("MI325X", 256, 6.0, 1307, 1000, 2615, 896, 5.0),
    )
}
GPU_TYPES: tuple[str, ...] = tuple(GPU_SPECS)


class GpuTypeConfig(StrictModel):
    """A GPU type declared in a config file (`[[gpu_types]]`): one not built in, or a built-in
    with your own figures (same name: it replaces the built-in)."""

    name: str = Field(pattern=GPU_NAME_PATTERN)
    memory_gb: float = Field(gt=0, le=10_000)
    memory_bandwidth_tbs: float = Field(gt=0, le=1_000)
    fp16_tflops: float = Field(gt=0, le=1_000_000)  # dense FP16/BF16, no sparsity
    fp8_tflops: float | None = Field(default=None, gt=0, le=1_000_000)
    interconnect_gbs: float = Field(default=PCIE_GEN4_GBS, gt=0)
    price_per_hour: float | None = Field(default=None, gt=0)
    tdp_w: float = Field(default=0.0, ge=0)
    device_names: list[str] = Field(default_factory=list)  # NVML / amdsmi names, exact

    def spec(self) -> GpuSpec:
        return GpuSpec(
            self.name, self.memory_gb, self.memory_bandwidth_tbs, self.fp16_tflops, self.tdp_w,
            self.fp8_tflops, self.interconnect_gbs, self.price_per_hour,
            tuple(self.device_names),
        )  # fmt: skip


class UnknownGpuName(ValueError):
    """A device name no GPU type here matches."""


class GpuCatalog(Mapping[str, GpuSpec]):
    """The GPU types a config may name: the built-ins, plus (or replaced by) its
    `[[gpu_types]]`. Read-only once built."""

    def __init__(self, declared: Iterable[GpuSpec] = ()) -> None:
        self._specs = dict(GPU_SPECS)
        self.declared: tuple[str, ...] = ()
        for spec in declared:
            if spec.name in self.declared:
                raise ValueError(f"GPU type {spec.name!r} is declared twice")
            self.declared += (spec.name,)
            self._specs[spec.name] = spec

    @classmethod
    def of(cls, types: Iterable[GpuTypeConfig]) -> GpuCatalog:
        return cls(t.spec() for t in types)

    def __getitem__(self, name: str) -> GpuSpec:
        return self._specs[name]

    def __iter__(self):
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def check(self, name: str) -> str:
        """`name` if it is a type here; else a ValueError saying how to declare it."""
        if name not in self._specs:
            raise ValueError(
                f"unknown GPU type {name!r}; known: {', '.join(self._specs)}; declare a new "
                "one under [[gpu_types]] (name, memory_gb, memory_bandwidth_tbs, fp16_tflops)"
            )
        return name

    def with_prices(self, prices: Mapping[str, float]) -> GpuCatalog:
        """The same types with some prices overridden (the router's [slo] gpu_prices)."""
        out = GpuCatalog()
        out._specs = {
            n: replace(s, price_per_hour=prices.get(n, s.price_per_hour))
            for n, s in self._specs.items()
        }
        out.declared = self.declared
        return out

    def type_of_device(self, device_name: str) -> str:
        """The type of a device as NVML (nvmlDeviceGetName) or amdsmi names it: a declared
        type's `device_names` first, then the built-in mapping (gpu_type_of_device)."""
        wanted = device_name.strip().casefold()
        for spec in self._specs.values():
            if any(n.casefold() == wanted for n in spec.device_names):
                return spec.name
        return gpu_type_of_device(device_name, self._specs)


GPUS_CONTEXT = "gpus"  # the validation context's catalog (gpuroute/config.py validate)


def _known_gpu(value: str, info: ValidationInfo) -> str:
    """A GPU type name checked against the file's catalog (its [[gpu_types]] and the
    built-ins), so the error names the key that used it."""
    catalog = (info.context or {}).get(GPUS_CONTEXT)
    if catalog is None:
        catalog = GpuCatalog()
    return catalog.check(value)


GpuTypeName = Annotated[str, Field(pattern=GPU_NAME_PATTERN), AfterValidator(_known_gpu)]


def gpu_context(
    data: Mapping[str, object], entry: type[GpuTypeConfig] = GpuTypeConfig
) -> dict[str, object]:
    """The validation context of a file with `[[gpu_types]]` (each an `entry`): its catalog
    (built-ins alone when the declarations are themselves invalid: their own errors are
    reported then)."""
    try:
        declared = TypeAdapter(list[entry]).validate_python(data.get("gpu_types", []))
        return {GPUS_CONTEXT: GpuCatalog.of(declared)}
    except (ValidationError, ValueError):
        return {GPUS_CONTEXT: GpuCatalog()}


# words NVML and amdsmi put around a GPU's model name, and model names that are variants of
# a type here ("Tesla V100S-PCIE-32GB" is a V100)
_NOISE = frozenset({"NVIDIA", "TESLA", "AMD", "INSTINCT", "RADEON", ""})
_VARIANTS = {"V100S": "V100", "H100NVL": "H100"}


def gpu_type_of_device(device_name: str, types: Iterable[str] = GPU_TYPES) -> str:
    """The GPU type of a device as NVML (nvmlDeviceGetName) or amdsmi names it:
    "NVIDIA H100 80GB HBM3" → H100, "Tesla T4" → T4, "NVIDIA A100-SXM4-40GB" → A100,
    "AMD Instinct MI300X" → MI300X. UnknownGpuName, saying how to declare it, otherwise."""
    words = [w for w in re.split(r"[\s\-_]+", device_name.strip().upper()) if w not in _NOISE]
    by_upper = {t.upper(): t for t in types}
    if words[:1] == ["RTX"] and "6000" in words and "ADA" in words and "RTX6000ADA" in by_upper:
        return by_upper["RTX6000ADA"]
    model = _VARIANTS.get(words[0], words[0]) if words else ""
    if model in by_upper:
        return by_upper[model]
    raise UnknownGpuName(
        f"GPU {device_name!r} is none of the known types ({', '.join(by_upper.values())}); "
        "declare it in the agent's config under [[gpu_types]] (name, memory_gb, "
        "memory_bandwidth_tbs, fp16_tflops, and device_names = [that name]) and name that "
        "type in [engine] gpu"
    )


class DeclaresGpuTypes(StrictModel):
    """A config file that may declare GPU types (`[[gpu_types]]`) besides the built-ins;
    every GPU type name in it is checked against both."""

    gpu_types: list[GpuTypeConfig] = Field(default_factory=list)

    @field_validator("gpu_types")
    @classmethod
    def _each_once(cls, types: list[GpuTypeConfig]) -> list[GpuTypeConfig]:
        GpuCatalog.of(types)  # raises on a name declared twice
        return types

    @classmethod
    def validation_context(cls, data: Mapping[str, object]) -> dict[str, object]:
        entry = get_args(cls.model_fields["gpu_types"].annotation)[0]
        return gpu_context(data, entry)

    def gpu_catalog(self) -> GpuCatalog:
        return GpuCatalog.of(self.gpu_types)
