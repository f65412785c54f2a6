"""GPU telemetry behind one interface: NVML on an NVIDIA host, amdsmi on an AMD one
(agent/amdsmi_source.py), the fake engine's simulated GPU elsewhere. A telemetry failure is
a log line and an error in the reading, never a crash: the agent must keep registering and
streaming load even when NVML or amdsmi misbehaves."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from gpuroute.gpus import GpuCatalog, UnknownGpuName

log = logging.getLogger("gpuroute.agent.gpu")

# Clock-event reasons that mean the GPU runs slower than it should (idle, app clocks and
# sync boost are normal operation; a power cap at TDP is normal under full load).
_DEGRADING_REASONS = {
    0x08: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
_OTHER_REASONS = {
    0x01: "gpu_idle",
    0x02: "applications_clocks",
    0x04: "sw_power_cap",
    0x10: "sync_boost",
}
# AMD's violation flags (amdsmi_get_violation_status, MI300 and later) in the same terms:
# PROCHOT and thermal limits slow a GPU that should not be slow; the package power limit
# (PPT) is reached under full load, as NVIDIA's sw_power_cap is
AMD_DEGRADING = {
    "active_prochot_thrm": "prochot_slowdown",
    "active_socket_thrm": "socket_thermal_slowdown",
    "active_vr_thrm": "vr_thermal_slowdown",
    "active_hbm_thrm": "hbm_thermal_slowdown",
}
AMD_OTHER = {"active_ppt_pwr": "ppt_power_cap"}
DEGRADING = frozenset(_DEGRADING_REASONS.values()) | frozenset(AMD_DEGRADING.values())


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    name: str
    util: float  # 0..1
    memory_total: int  # bytes
    memory_used: int
    temperature_c: float | None = None
    power_w: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_uncorrected: int | None = None  # volatile (since boot) uncorrected ECC errors
    retired_pages: int | None = None  # double-bit ECC retirements (pre-Hopper) or None
    row_remap_pending: bool | None = None  # Ampere/Hopper: a remap needs a GPU reset
    processes: int | None = None

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_total - self.memory_used)

    @property
    def throttled(self) -> bool:
        return any(r in DEGRADING for r in self.throttle_reasons)


@dataclass(frozen=True, slots=True)
class GpuReading:
    gpus: tuple[GpuSample, ...] = ()
    error: str | None = None  # why the reading is missing or partial

    @property
    def util(self) -> float:
        return sum(g.util for g in self.gpus) / len(self.gpus) if self.gpus else 0.0

    @property
    def memory_free(self) -> int:
        return sum(g.memory_free for g in self.gpus)

    @property
    def throttled(self) -> bool:
        return any(g.throttled for g in self.gpus)

    @property
    def ecc_uncorrected(self) -> int:
        return sum(g.ecc_uncorrected or 0 for g in self.gpus)

    @property
    def row_remap_pending(self) -> bool:
        return any(g.row_remap_pending for g in self.gpus)


class GpuSource(Protocol):
    name: str

    async def read(self) -> GpuReading: ...

    async def close(self) -> None: ...


def throttle_names(mask: int) -> tuple[str, ...]:
    names = {**_OTHER_REASONS, **_DEGRADING_REASONS}
    return tuple(name for bit, name in sorted(names.items()) if mask & bit)


class GpuUnavailable(Exception):
    """NVML or amdsmi cannot be used on this host (no library, no driver, no GPU)."""


def pick_indices(count: int, indices: Sequence[int] | None, library: str) -> tuple[int, ...]:
    """The GPUs this agent reports: `telemetry.gpu_indices` (its engine's, where engines
    share a host), else every GPU the library sees. An index the host lacks is an error."""
    if indices is None:
        return tuple(range(count))
    missing = [i for i in indices if i >= count]
    if missing:
        raise GpuUnavailable(
            f"telemetry.gpu_indices {missing}: {library} sees {count} GPU(s), 0 to {count - 1}"
        )
    return tuple(indices)


class NvmlSource:
    """NVML through nvidia-ml-py. Calls block, so reads run in a worker thread."""

    name = "nvml"

    def __init__(
        self,
        declared: str | None = None,
        catalog: GpuCatalog | None = None,
        indices: Sequence[int] | None = None,
    ) -> None:
        self.declared = declared  # the engine's `gpu` in the agent's config
        self.catalog = catalog or GpuCatalog()  # its [[gpu_types]]' device_names included
        self._checked = False
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise GpuUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
        self.nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
            self.count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise GpuUnavailable("libnvidia-ml.so not found (no NVIDIA driver)") from exc
        except pynvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML init failed: {exc}") from exc
        if self.count == 0:
            raise GpuUnavailable("NVML sees no GPU")
        self.indices = pick_indices(self.count, indices, "NVML")
        self._warned: set[str] = set()

    async def read(self) -> GpuReading:
        return await asyncio.to_thread(self.read_sync)

    def read_sync(self) -> GpuReading:
        # e.g. a GPU fallen off the bus raises NVMLError
        samplers = dict.fromkeys(self.indices, self._sample)
        return read_each(self, "NVML", self.nvml.NVMLError, samplers)

    def _optional(self, call, *args):
        """Metrics some GPUs do not support (ECC on L4, retired pages on Hopper) read as None."""
        try:
            return call(*args)
        except self.nvml.NVMLError as exc:
            key = f"{getattr(call, '__name__', call)}: {exc}"
            if key not in self._warned:
                self._warned.add(key)
                log.info("NVML: %s (reported as unknown)", key)
            return None

    def _sample(self, index: int) -> GpuSample:
        n = self.nvml
        h = n.nvmlDeviceGetHandleByIndex(index)
        name = n.nvmlDeviceGetName(h)
        memory = n.nvmlDeviceGetMemoryInfo(h)
        util = n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
        temp = self._optional(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        power_mw = self._optional(n.nvmlDeviceGetPowerUsage, h)
        reasons_call = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._optional(reasons_call, h) or 0
        ecc = self._optional(
            n.nvmlDeviceGetTotalEccErrors,
            h,
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_VOLATILE_ECC,
        )
        retired = self._optional(
            n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        remap = self._optional(n.nvmlDeviceGetRemappedRows, h)  # (corr, unc, pending, failed)
        procs = self._optional(n.nvmlDeviceGetComputeRunningProcesses, h)
        return GpuSample(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            util=util,
            memory_total=int(memory.total),
            memory_used=int(memory.used),
            temperature_c=float(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            throttle_reasons=throttle_names(int(mask)),
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            retired_pages=len(retired) if retired is not None else None,
            row_remap_pending=bool(remap[2] or remap[3]) if remap is not None else None,
            processes=len(procs) if procs is not None else None,
        )

    async def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def read_each(
    source: Any,  # NvmlSource or AmdSmiSource: declared, catalog, _checked, _warned
    library: str,
    error: type[BaseException],
    samplers: Mapping[int, Callable[[int], GpuSample]],
) -> GpuReading:
    """One reading of each GPU (index -> `samplers[index](index)`) through a vendor library:
    a GPU that stops answering is an error in the reading, logged once; the first good
    reading is checked against the declared GPU type."""
    gpus, errors = [], []
    for index, sample in samplers.items():
        try:
            gpus.append(sample(index))
        except error as exc:
            errors.append(f"gpu {index}: {exc}")
    if gpus and not source._checked:
        source._checked = True
        for problem in declared_type_problems(gpus, source.declared, source.catalog):
            log.warning("GPU type: %s", problem)
    message = "; ".join(errors) or None
    if message and message not in source._warned:
        source._warned.add(message)
        log.error("%s read failed: %s", library, message)
    return GpuReading(tuple(gpus), message)


@dataclass
class SimulatedSource:
    """Reads the fake engine's simulated GPU (GET /_gpu): those of `indices`, else all."""

    url: str
    timeout_s: float = 1.0
    indices: tuple[int, ...] | None = None
    name: str = "simulated"
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    async def read(self) -> GpuReading:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        try:
            async with self._session.get(self.url) as response:
                if response.status != 200:
                    return GpuReading(error=f"{self.url}: HTTP {response.status}")
                body = await response.json()
            return self._pick(tuple(_sample_from_json(g) for g in body["gpus"]))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError) as exc:
            return GpuReading(error=f"{self.url}: {type(exc).__name__} {exc}".strip())

    def _pick(self, gpus: tuple[GpuSample, ...]) -> GpuReading:
        if self.indices is None:
            return GpuReading(gpus)
        mine = tuple(g for g in gpus if g.index in self.indices)
        missing = sorted(set(self.indices) - {g.index for g in mine})
        error = f"{self.url}: no GPU {missing} (telemetry.gpu_indices)" if missing else None
        return GpuReading(mine, error)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class NoGpuSource:
    """No GPU data: NVML was asked for and cannot run (`reason`, which marks the host
    degraded), or the operator chose `source = "none"` (no reason: nothing is wrong)."""

    name = "none"

    def __init__(self, reason: str | None) -> None:
        self.reason = reason

    async def read(self) -> GpuReading:
        return GpuReading(error=self.reason)

    async def close(self) -> None:
        return None


def _sample_from_json(g: dict[str, Any]) -> GpuSample:
    return GpuSample(
        index=int(g["index"]),
        name=str(g["name"]),
        util=float(g["util"]),
        memory_total=int(g["memory_total"]),
        memory_used=int(g["memory_used"]),
        temperature_c=g.get("temperature_c"),
        power_w=g.get("power_w"),
        throttle_reasons=tuple(g.get("throttle_reasons", ())),
        ecc_uncorrected=g.get("ecc_uncorrected"),
        retired_pages=g.get("retired_pages"),
        row_remap_pending=g.get("row_remap_pending"),
        processes=g.get("processes"),
    )


def declared_type_problems(
    gpus: Sequence[GpuSample], declared: str | None, catalog: GpuCatalog | None = None
) -> list[str]:
    """Where the GPUs NVML or amdsmi name are not the type the config declares (the declared
    one is used: the operator may know better, e.g. a variant named like its family). Names
    are looked up in the config's catalog, so a `[[gpu_types]]` entry's `device_names` count."""
    catalog = catalog or GpuCatalog()
    problems = []
    for gpu in gpus:
        try:
            seen = catalog.type_of_device(gpu.name)
        except UnknownGpuName as exc:
            problems.append(f"gpu {gpu.index}: {exc}")
            continue
        if declared is not None and seen != declared:
            problems.append(
                f"gpu {gpu.index} is {gpu.name!r} ({seen}) but engine.gpu says {declared}; "
                f"the router prices it as {declared}"
            )
    return problems
