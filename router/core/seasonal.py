"""A seasonal model of each pool's arrival rate, so a pool grows before a daily peak
arrives rather than when it does (sans-IO: counts and times come in, forecasts go out).

Arrivals are counted in buckets (`season_s / buckets_per_season` long, aligned to the
season's phase). Once `min_seasons` whole seasons are counted, statsmodels' Holt-Winters
(additive seasonality) is fitted again on each completed bucket, and the forecast is the
highest rate it expects from now until one lead time ahead: what a backend started now
would be in time for. Before that there is no forecast, and the pool follows its smoothed
rate and trend alone."""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class SeasonalSettings:
    season_s: float = 86_400.0  # a day
    buckets_per_season: int = 96  # 15 minutes each over a day
    min_seasons: int = 2  # whole seasons counted before the model is trusted
    max_seasons: int = 7  # kept (a week)

    def __post_init__(self) -> None:
        if self.season_s <= 0 or self.buckets_per_season < 4:
            raise ValueError("season_s must be > 0 and buckets_per_season >= 4")
        if not 2 <= self.min_seasons <= self.max_seasons:
            raise ValueError("need 2 <= min_seasons <= max_seasons")

    @property
    def bucket_s(self) -> float:
        return self.season_s / self.buckets_per_season


@dataclass
class SeasonalRate:
    """One pool's history and model. `arrive(now)` counts; `forecast(now, horizon_s)` is
    the highest rate (requests/s) expected within the horizon, or None without a model."""

    settings: SeasonalSettings = field(default_factory=SeasonalSettings)
    _counts: deque[float] = field(default_factory=deque)
    _bucket: int | None = None  # index of the bucket being counted (the deque's last)
    _fitted_through: int | None = None  # last completed bucket the model has seen
    _forecasts: np.ndarray | None = None  # rates for the buckets after _fitted_through

    def arrive(self, now: float, count: float = 1.0) -> None:
        self._advance(now)
        self._counts[-1] += count

    def _advance(self, now: float) -> None:
        bucket = math.floor(now / self.settings.bucket_s)
        if self._bucket is None:
            self._bucket = bucket
            self._counts.append(0.0)
            return
        kept = self.settings.max_seasons * self.settings.buckets_per_season + 1
        if bucket - self._bucket > kept:  # a silence longer than the history: start over
            self._counts.clear()
            self._bucket = bucket - 1
        while self._bucket < bucket:  # buckets without arrivals count zero
            self._bucket += 1
            self._counts.append(0.0)
            if len(self._counts) > kept:
                self._counts.popleft()

    def forecast(self, now: float, horizon_s: float) -> float | None:
        self._advance(now)
        s = self.settings
        complete = len(self._counts) - 1  # the last bucket is still being counted
        if complete < s.min_seasons * s.buckets_per_season:
            return None
        assert self._bucket is not None
        last_complete = self._bucket - 1
        if self._fitted_through != last_complete:
            self._fit(last_complete)
        assert self._forecasts is not None and self._fitted_through is not None
        first = self._bucket - self._fitted_through - 1  # the bucket being counted
        last = math.floor((now + horizon_s) / s.bucket_s) - self._fitted_through - 1
        window = self._forecasts[first : max(last, first) + 1]
        return float(window.max()) if len(window) else None

    def _fit(self, last_complete: int) -> None:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing  # ~1 s to import

        s = self.settings
        rates = np.array(list(self._counts)[:-1]) / s.bucket_s
        with warnings.catch_warnings():  # short or flat histories warn; the fit still holds
            warnings.simplefilter("ignore")
            model = ExponentialSmoothing(
                rates,
                seasonal="add",
                seasonal_periods=s.buckets_per_season,
                initialization_method="heuristic",
            ).fit()
            ahead = model.forecast(s.buckets_per_season)
        self._forecasts = np.maximum(np.asarray(ahead, dtype=float), 0.0)
        self._fitted_through = last_complete
