"""AMD GPUs through ROCm's `amdsmi` Python package, read as NvmlSource reads NVIDIA's.

Written against amdsmi's documented Python API (ROCm/amdsmi py-interface, ROCm 6.x):
- amdsmi_init(), amdsmi_get_processor_handles(), amdsmi_shut_down();
- amdsmi_get_gpu_asic_info(h)["market_name"]: "AMD Instinct MI300X";
- amdsmi_get_gpu_vram_usage(h): {"vram_total", "vram_used"} in MB (MiB);
- amdsmi_get_gpu_activity(h)["gfx_activity"]: percent, or "N/A";
- amdsmi_get_temp_metric(h, AmdSmiTemperatureType.X, AmdSmiTemperatureMetric.CURRENT):
  degrees C (the library divides the sensor's millidegrees); MI300 has no EDGE sensor, so
  HOTSPOT (junction) is read when EDGE is missing;
- amdsmi_get_power_info(h): "current_socket_power" / "average_socket_power" in W, "N/A"
  where the GPU does not report it;
- amdsmi_get_violation_status(h) (ROCm 6.3+, MI300): "active_*" booleans, "N/A" when
  unknown;
- amdsmi_get_gpu_total_ecc_count(h)["uncorrectable_count"];
- amdsmi_get_gpu_bad_page_info(h): retired pages; amdsmi_get_gpu_process_list(h).
Unsupported calls raise amdsmi.AmdSmiException (AmdSmiLibraryException): such a metric reads
as unknown, as with NVML. No AMD GPU is at hand here, so the tests drive it with a fake module
shaped like this API (tests/unit/test_agent_gpu_sources.py).

`open_gpu_source` chooses among every source (NVML, amdsmi, simulated, none): it sits here,
above all of them, as agent/gpu_telemetry.py's sources are the ground this one builds on."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from gpuroute.agent.gpu_telemetry import (
    AMD_DEGRADING,
    AMD_OTHER,
    GpuReading,
    GpuSample,
    GpuSource,
    GpuUnavailable,
    NoGpuSource,
    NvmlSource,
    SimulatedSource,
    pick_indices,
    read_each,
)

from gpuroute.gpus import GpuCatalog

log = logging.getLogger("gpuroute.agent.gpu")
MIB = 1 << 20
HOW_TO_INSTALL = (
    "the amdsmi Python package ships with ROCm: install it into the agent's environment "
    "with `python3 -m pip install /opt/rocm/share/amd_smi` (`pip install amdsmi` from PyPI "
    "also needs ROCm's libamd_smi.so, e.g. LD_LIBRARY_PATH=/opt/rocm/lib)"
)


def import_amdsmi() -> Any:
    """The amdsmi module, or GpuUnavailable saying how to get it."""
    try:
        import amdsmi  # type: ignore[import-not-found]
    except ImportError as exc:
        raise GpuUnavailable(f"amdsmi is not importable ({exc}); {HOW_TO_INSTALL}") from exc
    except OSError as exc:  # the package is there, libamd_smi.so is not
        raise GpuUnavailable(f"amdsmi cannot load its library ({exc}); {HOW_TO_INSTALL}") from exc
    return amdsmi


class AmdSmiSource:
    """AMD GPUs. Calls block, so reads run in a worker thread (as NVML's do)."""

    name = "amdsmi"

    def __init__(
        self,
        declared: str | None = None,
        catalog: GpuCatalog | None = None,
        indices: Sequence[int] | None = None,  # telemetry.gpu_indices; None: all
        module: Any = None,  # the tests' fake; None imports the real one
    ) -> None:
        self.declared = declared
        self.catalog = catalog or GpuCatalog()
        self.smi: Any = module if module is not None else import_amdsmi()
        self.error: type[BaseException] = getattr(self.smi, "AmdSmiException", Exception)
        try:
            self.smi.amdsmi_init()
            self.handles = list(self.smi.amdsmi_get_processor_handles())
        except self.error as exc:
            raise GpuUnavailable(f"amdsmi init failed: {exc}") from exc
        if not self.handles:
            raise GpuUnavailable("amdsmi sees no GPU (is the amdgpu driver loaded?)")
        self.count = len(self.handles)
        self.indices = pick_indices(self.count, indices, "amdsmi")
        self._checked = False
        self._warned: set[str] = set()

    async def read(self) -> GpuReading:
        return await asyncio.to_thread(self.read_sync)

    def read_sync(self) -> GpuReading:
        sample = self._sample_handle
        samplers = {i: functools.partial(sample, self.handles[i]) for i in self.indices}
        return read_each(self, "amdsmi", self.error, samplers)

    def _sample_handle(self, handle: Any, index: int) -> GpuSample:
        return self._sample(index, handle)

    def _optional(self, call: Callable[..., Any], *args: Any) -> Any:
        """A metric this GPU or driver does not report reads as None (logged once)."""
        try:
            return call(*args)
        except self.error as exc:
            key = f"{getattr(call, '__name__', call)}: {exc}"
            if key not in self._warned:
                self._warned.add(key)
                log.info("amdsmi: %s (reported as unknown)", key)
            return None

    def _sample(self, index: int, h: Any) -> GpuSample:
        s = self.smi
        name = s.amdsmi_get_gpu_asic_info(h).get("market_name", "N/A")
        vram = s.amdsmi_get_gpu_vram_usage(h)
        activity = self._optional(s.amdsmi_get_gpu_activity, h) or {}
        ecc = self._optional(s.amdsmi_get_gpu_total_ecc_count, h) or {}
        bad_pages = self._optional(s.amdsmi_get_gpu_bad_page_info, h)
        procs = self._optional(s.amdsmi_get_gpu_process_list, h)
        return GpuSample(
            index=index,
            name=str(name),
            util=(_number(activity.get("gfx_activity")) or 0.0) / 100.0,
            memory_total=int(vram["vram_total"]) * MIB,
            memory_used=int(vram["vram_used"]) * MIB,
            temperature_c=self._temperature(h),
            power_w=self._power(h),
            throttle_reasons=self._throttle(h),
            ecc_uncorrected=_int_or_none(ecc.get("uncorrectable_count")),
            retired_pages=len(bad_pages) if isinstance(bad_pages, list) else None,
            processes=len(procs) if isinstance(procs, list) else None,
        )

    def _temperature(self, h: Any) -> float | None:
        s = self.smi
        current = s.AmdSmiTemperatureMetric.CURRENT
        for sensor in (s.AmdSmiTemperatureType.EDGE, s.AmdSmiTemperatureType.HOTSPOT):
            value = _number(self._optional(s.amdsmi_get_temp_metric, h, sensor, current))
            if value:  # 0 is what a missing EDGE sensor reads on MI300
                return value
        return None

    def _power(self, h: Any) -> float | None:
        info = self._optional(self.smi.amdsmi_get_power_info, h) or {}
        keys = ("current_socket_power", "average_socket_power", "socket_power")
        return next((v for k in keys if (v := _number(info.get(k))) is not None), None)

    def _throttle(self, h: Any) -> tuple[str, ...]:
        call = getattr(self.smi, "amdsmi_get_violation_status", None)  # ROCm 6.3+
        status = self._optional(call, h) if call is not None else None
        if not isinstance(status, dict):
            return ()
        names = {**AMD_DEGRADING, **AMD_OTHER}
        return tuple(sorted(name for key, name in names.items() if status.get(key) is True))

    async def close(self) -> None:
        with contextlib.suppress(self.error):
            self.smi.amdsmi_shut_down()


def _number(value: Any) -> float | None:
    """amdsmi writes "N/A" where a GPU has no such reading."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int_or_none(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def open_gpu_source(
    kind: str,
    simulated_url: str,
    declared: str | None = None,
    catalog: GpuCatalog | None = None,
    indices: Sequence[int] | None = None,
) -> GpuSource:
    """`auto` takes NVML, else amdsmi, when one works, and the simulated GPU otherwise;
    `nvml` or `amdsmi` logs an error and carries on without GPU data when it cannot run.
    `indices`: the GPUs of this agent's engine (all of the host's when None)."""
    if kind == "none":  # an engine on CPUs, or GPU telemetry collected elsewhere
        return NoGpuSource(None)
    if kind == "simulated":
        return SimulatedSource(simulated_url, indices=_tuple(indices))
    why: list[str] = []
    for name, opener in (("nvml", NvmlSource), ("amdsmi", AmdSmiSource)):
        if kind not in ("auto", name):
            continue
        try:
            source = opener(declared, catalog, indices)
            log.info("GPU telemetry: %s, GPU(s) %s", name, ",".join(map(str, source.indices)))
            return source
        except GpuUnavailable as exc:
            label = "NVML" if name == "nvml" else "amdsmi"
            if kind == name:
                why_not = f"{label} unavailable ({exc}); running without GPU data"
                log.error("GPU telemetry: %s", why_not)
                return NoGpuSource(f"{label} unavailable: {exc}")
            why.append(f"{label} unavailable ({exc})")
    log.info("GPU telemetry: %s; using the simulated GPU", "; ".join(why))
    return SimulatedSource(simulated_url, indices=_tuple(indices))


def _tuple(indices: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if indices is None else tuple(indices)
