"""Slow start: a backend that just joined or came back from ejection gets a growing share.

Envoy's formula: weight × max(min_weight_percent, (t / window) ^ (1 / aggression))."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlowStart:
    window_s: float = 30.0
    aggression: float = 1.0
    min_weight: float = 0.1

    def __post_init__(self) -> None:
        if self.window_s < 0 or self.aggression <= 0 or not 0 < self.min_weight <= 1:
            raise ValueError("slow start needs window_s >= 0, aggression > 0, 0 < min_weight <= 1")

    def factor(self, elapsed_s: float) -> float:
        """Capacity multiplier after `elapsed_s` seconds of warming, in [min_weight, 1]."""
        if self.window_s == 0 or elapsed_s >= self.window_s:
            return 1.0
        ramp = max(elapsed_s, 0.0) / self.window_s
        return max(self.min_weight, ramp ** (1.0 / self.aggression))

    def finished(self, elapsed_s: float) -> bool:
        return elapsed_s >= self.window_s
