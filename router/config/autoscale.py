"""The `[autoscale]` section: how a router sizes its model pools (router/core/autoscale.py),
when it brings warm standby backends in and sends them back (router/core/standby.py), and
the seasonal model that lets a pool grow before a daily peak (router/core/seasonal.py).
A scenario's `[autoscale]` (sim/scaling.py) is this section plus what the simulator must
know of the machines: how long one takes to boot and load its model."""

from __future__ import annotations

from gpuroute.router.core.autoscale import AutoscaleSettings
from gpuroute.router.core.seasonal import SeasonalSettings
from pydantic import Field, model_validator

from gpuroute.config import StrictModel

CORE = AutoscaleSettings()  # the core's defaults
SEASONAL = SeasonalSettings()


class SeasonalConfig(StrictModel):
    enabled: bool = True
    season_s: float = Field(default=SEASONAL.season_s, gt=0)  # a day
    buckets_per_season: int = Field(default=SEASONAL.buckets_per_season, ge=4, le=10_000)
    min_seasons: int = Field(default=SEASONAL.min_seasons, ge=2, le=28)
    max_seasons: int = Field(default=SEASONAL.max_seasons, ge=2, le=28)

    @model_validator(mode="after")
    def _history_holds_the_minimum(self) -> SeasonalConfig:
        if self.max_seasons < self.min_seasons:
            raise ValueError("max_seasons must be >= min_seasons")
        return self

    def settings(self) -> SeasonalSettings:
        return SeasonalSettings(
            self.season_s, self.buckets_per_season, self.min_seasons, self.max_seasons
        )


class AutoscaleConfig(StrictModel):
    """The core's AutoscaleSettings as a config section (its defaults are the core's)."""

    enabled: bool = True  # the desired sizes are computed and exported
    interval_s: float = Field(default=15.0, gt=0, le=600)
    scale_up_utilisation: float = Field(default=CORE.scale_up_utilisation, gt=0, le=1)
    scale_down_utilisation: float = Field(default=CORE.scale_down_utilisation, gt=0, lt=1)
    scale_down_after_s: float = Field(default=CORE.scale_down_after_s, ge=0)
    # boot plus model load of a new backend: how far ahead demand is forecast
    lead_time_s: float = Field(default=CORE.lead_time_s, ge=0)
    standby_backends: int = Field(default=CORE.standby_backends, ge=0)
    min_backends: int = Field(default=CORE.min_backends, ge=0)
    max_backends: int = Field(default=CORE.max_backends, ge=1)
    rate_window_s: float = Field(default=CORE.rate_window_s, gt=0)
    trend_window_s: float = Field(default=CORE.trend_window_s, gt=0)
    # standby backends brought in go back once their pool stayed below the low mark this long
    release_after_s: float = Field(default=120.0, ge=0)
    # one backend's SLO capacity in requests/s per pool (model), measured (`gpuroute plan
    # --json` prints it); a pool without one uses the router's estimate from its priors
    capacity_rps: dict[str, float] = Field(default_factory=dict)
    seasonal: SeasonalConfig = SeasonalConfig()

    @model_validator(mode="after")
    def _core_accepts(self) -> AutoscaleConfig:
        for pool, rps in self.capacity_rps.items():
            if not rps > 0:
                raise ValueError(f"capacity_rps.{pool}: must be > 0, got {rps}")
        self.settings()  # the core's checks (thresholds' order, bounds), as config errors
        return self

    def settings(self, lead_time_s: float | None = None) -> AutoscaleSettings:
        return AutoscaleSettings(
            scale_up_utilisation=self.scale_up_utilisation,
            scale_down_utilisation=self.scale_down_utilisation,
            scale_down_after_s=self.scale_down_after_s,
            lead_time_s=self.lead_time_s if lead_time_s is None else lead_time_s,
            standby_backends=self.standby_backends,
            min_backends=self.min_backends,
            max_backends=self.max_backends,
            rate_window_s=self.rate_window_s,
            trend_window_s=self.trend_window_s,
        )
