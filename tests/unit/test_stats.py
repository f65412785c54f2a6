"""The one percentile (gpuroute/stats.py, issue 44 item 7): linear interpolation between
the closest ranks, as the simulator's reports have always given it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuroute.stats import percentile


def test_percentiles_interpolate_between_ranks() -> None:
    hundred = [float(i) for i in range(1, 101)]
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(hundred, 99) == pytest.approx(99.01)  # nearest rank would say 99
    assert percentile(np.asarray(hundred), 99) == percentile(hundred, 99)
    assert percentile([5.0], 99) == 5.0


def test_no_values_have_the_callers_answer() -> None:
    assert math.isnan(percentile([], 99))
    assert percentile(np.asarray([]), 50, empty=0.0) == 0.0
