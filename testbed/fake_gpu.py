"""The fake engine's simulated GPU, shaped like what NVML reports for a real one.

The agent's simulated telemetry source reads it (GET /_gpu on the fake engine), so the agent
runs the same code path on a laptop as on a GPU host, minus the NVML calls. Utilisation is
whether the engine has work, smoothed over the last second (what nvidia-smi calls util);
temperature and power follow utilisation; a throttle fault shows as a thermal slowdown."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpuroute.gpus import GpuSpec

IDLE_TEMP_C = 34.0
FULL_LOAD_TEMP_C = 72.0
THROTTLED_TEMP_C = 91.0
IDLE_POWER_FRACTION = 0.12


class SimulatedGpu:
    def __init__(
        self,
        spec: GpuSpec,
        weights_bytes: float,
        kv_bytes: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.weights_bytes = weights_bytes
        self.kv_bytes = kv_bytes
        self.clock = clock
        self._last = clock()
        self._util = 0.0

    def utilisation(self, busy: bool, window_s: float = 1.0) -> float:
        """Fraction of the last `window_s` the engine had work (exponentially weighted)."""
        now = self.clock()
        weight = min(1.0, (now - self._last) / window_s)
        self._util += weight * (float(busy) - self._util)
        self._last = now
        return self._util

    def sample(
        self, *, busy: bool, kv_usage: float, throttled: bool, processes: int
    ) -> dict[str, Any]:
        util = self.utilisation(busy)
        total = int(self.spec.memory_gb * 1e9)
        used = min(total, int(self.weights_bytes + kv_usage * self.kv_bytes))
        warm = IDLE_TEMP_C + util * (FULL_LOAD_TEMP_C - IDLE_TEMP_C)
        temp = THROTTLED_TEMP_C if throttled else warm
        power = self.spec.tdp_w * (IDLE_POWER_FRACTION + (1 - IDLE_POWER_FRACTION) * util)
        return {
            "gpus": [
                {
                    "index": 0,
                    "name": f"NVIDIA {self.spec.name} (simulated)",
                    "util": round(util, 4),
                    "memory_total": total,
                    "memory_used": used,
                    "temperature_c": round(temp, 1),
                    "power_w": round(power, 1),
                    "throttle_reasons": ["hw_thermal_slowdown"] if throttled else [],
                    "ecc_uncorrected": 0,
                    "retired_pages": 0,
                    "processes": processes,
                }
            ]
        }
