"""Capacity spillover with hysteresis (pure).

A region starts spilling when its utilisation reaches `start` and stops only once it is
back under `stop`, so it does not flap around one threshold. While spilling, the fraction
of its traffic sent to the next region grows linearly from 0 at `stop` to `max_fraction`
at `full`. A region that is spilling itself receives no spill (the waterfall moves on),
which is how "never more than the receiver can absorb" holds: a receiver filling up to
`start` closes itself to spill."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpillSettings:
    start: float = 0.85
    stop: float = 0.75
    full: float = 1.0
    max_fraction: float = 0.9  # some traffic always stays home (latency, cache warmth)

    def __post_init__(self) -> None:
        if not 0 < self.stop < self.start <= self.full:
            raise ValueError("spillover needs 0 < stop < start <= full")
        if not 0 < self.max_fraction <= 1:
            raise ValueError("spillover max_fraction must be in (0, 1]")


class Spillover:
    def __init__(self, settings: SpillSettings | None = None) -> None:
        self.settings = settings or SpillSettings()
        self.spilling: dict[str, bool] = {}
        self.utilisation: dict[str, float] = {}

    def update(self, region: str, utilisation: float) -> bool:
        """Feed a region's utilisation; returns whether it is spilling now."""
        s = self.settings
        on = self.spilling.get(region, False)
        if utilisation >= s.start:
            on = True
        elif utilisation < s.stop:
            on = False
        self.spilling[region] = on
        self.utilisation[region] = utilisation
        return on

    def fraction(self, region: str) -> float:
        """Share of the region's traffic to send on to the next region."""
        if not self.spilling.get(region, False):
            return 0.0
        s = self.settings
        u = self.utilisation.get(region, 0.0)
        return min(s.max_fraction, max(0.0, (u - s.stop) / (s.full - s.stop)) * s.max_fraction)

    def can_receive(self, region: str) -> bool:
        return not self.spilling.get(region, False)
