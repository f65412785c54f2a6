"""Arrival rates that move through a day, with flash crowds on top: a scenario's
`[workload.daily]`, applied to any request stream by changing its clock.

The stream is drawn (or read) at the day's peak rate; each arrival time is then mapped
through the inverse of the cumulative rate shape (the time-change theorem: a Poisson
stream at the peak rate becomes one whose rate follows the shape, and a trace keeps its
burstiness at every hour). A day may be compressed (`day_s` shorter than 86,400 s), so a
simulated day takes minutes; boot and model-load times are not compressed, which makes a
compressed day harder for an autoscaler than a real one.

The built-in shapes (rate each hour, the peak hour 1.0) are synthetic, of the common kind:
one trough at night, one broad peak in working hours. No trace here spans a day; set your
own measured 24 values with `hourly`."""

from __future__ import annotations

import numpy as np
from pydantic import Field, model_validator

from gpuroute.config import StrictModel

# Working hours in one time zone: night at 6-12 % of the peak, mean 0.48.
BUSINESS_DAY = (
    0.12, 0.09, 0.07, 0.06, 0.06, 0.08, 0.14, 0.28, 0.50, 0.75, 0.90, 0.97,
    0.93, 0.96, 1.00, 0.97, 0.88, 0.72, 0.55, 0.45, 0.38, 0.30, 0.22, 0.16,
)  # fmt: skip
# Users across time zones: the trough at 15 % of the peak, mean 0.59.
CONSUMER_DAY = (
    0.30, 0.22, 0.17, 0.15, 0.15, 0.18, 0.27, 0.42, 0.62, 0.80, 0.92, 0.98,
    0.95, 0.97, 1.00, 0.98, 0.92, 0.82, 0.70, 0.62, 0.58, 0.52, 0.45, 0.37,
)  # fmt: skip
SHAPES = {"business-day": BUSINESS_DAY, "consumer-day": CONSUMER_DAY}
GRID_S = 1.0  # resolution of the clock change, in simulated seconds


class FlashCrowd(StrictModel):
    """`factor` times the day's rate from `at_s` for `duration_s` (a marketing blast)."""

    at_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    factor: float = Field(gt=1, le=100)


class DailySection(StrictModel):
    shape: str = "business-day"  # a built-in shape, unless `hourly` is given
    hourly: list[float] | None = Field(default=None, min_length=24, max_length=24)
    day_s: float = Field(default=86_400.0, ge=60)  # a simulated day's length (compressed)
    days: float = Field(default=1.0, gt=0, le=30)
    start_hour: float = Field(default=0.0, ge=0, lt=24)
    crowds: list[FlashCrowd] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_shape(self) -> DailySection:
        if self.hourly is None and self.shape not in SHAPES:
            raise ValueError(f"shape: unknown {self.shape!r}; known: {', '.join(SHAPES)}")
        if self.hourly is not None and (min(self.hourly) < 0 or max(self.hourly) <= 0):
            raise ValueError("hourly: rates must be >= 0 with at least one above 0")
        return self

    @property
    def span_s(self) -> float:
        return self.days * self.day_s

    def levels(self) -> np.ndarray:
        """The 24 hourly rates relative to the peak hour."""
        values = np.asarray(self.hourly or SHAPES[self.shape], dtype=float)
        return values / values.max()

    def relative_rate(self, t: np.ndarray) -> np.ndarray:
        """The rate at simulated times `t` relative to the daily peak (flash crowds in)."""
        hours = (self.start_hour + 24.0 * t / self.day_s) % 24.0
        levels = self.levels()
        rate = np.interp(hours, np.arange(25.0), np.append(levels, levels[0]))
        for crowd in self.crowds:
            inside = (t >= crowd.at_s) & (t < crowd.at_s + crowd.duration_s)
            rate = np.where(inside, rate * crowd.factor, rate)
        return rate

    def expected_requests(self, peak_rps: float) -> float:
        grid = np.arange(0.0, self.span_s, GRID_S)
        return float(self.relative_rate(grid).sum() * GRID_S * peak_rps)


def change_clock(arrivals: np.ndarray, daily: DailySection) -> np.ndarray:
    """Arrival times of a stream at the peak rate, moved so its rate follows the day; the
    ones past the last day are dropped (the caller cuts the other columns to match)."""
    grid = np.arange(0.0, daily.span_s + GRID_S, GRID_S)
    cumulative = np.concatenate(([0.0], np.cumsum(daily.relative_rate(grid[:-1]) * GRID_S)))
    start = arrivals[0] if len(arrivals) else 0.0
    peak_time = arrivals - start  # where each would be at the peak rate
    kept = peak_time <= cumulative[-1]
    return np.interp(peak_time[kept], cumulative, grid)
