"""The one percentile every figure is given in: the live router's region report, the
simulator's reports, the planner and the benchmarks.

Linear interpolation between the closest ranks (numpy's default, Hyndman and Fan's type
7), the definition the simulator's reports have always used; the region report's p99 was
nearest-rank before, up to one rank apart from this on the same values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def quantile(
    values: Sequence[float] | np.ndarray, fraction: float, empty: float = math.nan
) -> float:
    """The `fraction` (0 to 1) quantile of `values`; `empty` when there are none."""
    if len(values) == 0:
        return empty
    return float(np.quantile(values, fraction))


def percentile(values: Sequence[float] | np.ndarray, q: float, empty: float = math.nan) -> float:
    """The `q`th percentile (0 to 100): the quantile at q / 100, as numpy divides it."""
    return quantile(values, q / 100, empty)
