"""Faults a fake engine can be told to show (`POST /_fault`): hang, slowness, thermal
throttling, injected errors, and a crash (handled by the engine: it exits)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

FAULT_KEYS = frozenset({"crash", "hang", "slow", "throttle", "error_rate", "clear"})


@dataclass
class Faults:
    hang: bool = False
    slow: float = 1.0
    throttle: float = 1.0
    error_rate: float = 0.0
    resumed: asyncio.Event = field(default_factory=asyncio.Event)

    def as_dict(self) -> dict[str, Any]:
        return {
            "hang": self.hang,
            "slow": self.slow,
            "throttle": self.throttle,
            "error_rate": self.error_rate,
        }

    def apply(self, spec: dict[str, Any]) -> None:
        """Apply a fault body; ValueError or TypeError (nothing changed) when it is bad."""
        unknown = set(spec) - FAULT_KEYS
        if unknown:
            raise ValueError(f"unknown fault keys: {', '.join(sorted(unknown))}")
        slow = _positive(spec["slow"], "slow") if "slow" in spec else None
        throttle = _positive(spec["throttle"], "throttle") if "throttle" in spec else None
        rate = float(spec["error_rate"]) if "error_rate" in spec else None
        if rate is not None and not 0 <= rate <= 1:
            raise ValueError("error_rate must be in [0, 1]")
        if spec.get("clear"):
            self.hang, self.slow, self.throttle, self.error_rate = False, 1.0, 1.0, 0.0
        if slow is not None:
            self.slow = slow
        if throttle is not None:
            self.throttle = throttle
        if rate is not None:
            self.error_rate = rate
        if "hang" in spec:
            self.hang = bool(spec["hang"])
        if self.hang:
            self.resumed.clear()
        else:
            self.resumed.set()


def _positive(value: Any, name: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError(f"{name} must be > 0")
    return number
