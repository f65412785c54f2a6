"""The router's own pools sized live: the shell around FleetSizer (router/core/fleet_sizer.py)
that feeds it what this router sees, ticks it every `[autoscale] interval_s`, and shows
its answer as `gpuroute_pool_*` gauges and `GET /admin/autoscale`. The simulator drives
the same core (sim/scaling.py), so the two size pools alike.

One clock feeds the sizer: wall time, because the seasonal model's buckets are aligned to
days; arrivals and ticks both read it, so the rate windows agree. The attempts loop
promotes standby backends on the router's monotonic clock and the tick sends them back on
wall time: both stamp only `state_since`, which no rule reads for STANDBY or a promoted
READY.

Replicas agree on one region-wide rate: each shares its own smoothed per-pool rate on the
shared-load board (router/shared/load.py), and a tick sizes with its own plus its fresh
peers'. Without a board, or while it is down, a router sizes with its own."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable

from gpuroute.router.config.autoscale import AutoscaleConfig
from gpuroute.router.config.router import SloConfig
from gpuroute.router.core.autoscale import PoolSize
from gpuroute.router.core.fleet_sizer import FleetSizer, PoolRates
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.core.standby import StandbyRotation

from gpuroute.runtime import BackgroundLoop

log = logging.getLogger("gpuroute.router.autoscale")


def tightest_tpot(slo: SloConfig) -> float:
    """What a backend's SLO capacity is estimated at: the most demanding class's TPOT."""
    return min(c.tpot_s for c in slo.classes)


class Autoscaler:
    """Counts arrivals, holds and finished requests; every `interval_s` sizes the pools
    and sends quiet pools' promoted standby backends back. `enabled = false` in the config
    stops the sizes being shown (no gauges, `/admin/autoscale` 404) and the seasonal model,
    not the standby rotation: a standby host is the operator's choice, and one brought in
    still goes back once its pool is quiet."""

    def __init__(
        self,
        config: AutoscaleConfig,
        scheduler: Scheduler,
        slo: SloConfig,
        *,
        rates: PoolRates | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config, self.wall = config, wall
        self.standby = StandbyRotation(scheduler.backends, config.release_after_s)
        seasonal = config.seasonal if config.enabled and config.seasonal.enabled else None
        self.sizer = FleetSizer(
            scheduler,
            config.settings(),
            tpot_s=tightest_tpot(slo),
            capacity_rps=config.capacity_rps,
            seasonal=None if seasonal is None else seasonal.settings(),
            standby=self.standby,
        )
        # this router's rates at the last tick, and its peers' from the shared-load board
        self.rates = PoolRates() if rates is None else rates
        self.sizes: dict[str, PoolSize] = {}
        self._loop = BackgroundLoop()
        self._counted = (0, 0)  # promotions and releases logged so far

    # -- what the router sees ------------------------------------------------------------------
    def arrived(self, model: str) -> None:
        self.sizer.arrive(model, self.wall())

    def held(self, model: str) -> None:
        self.sizer.held(model)

    def served(self, model: str, prompt_tokens: int, output_tokens: int) -> None:
        self.sizer.served(model, prompt_tokens, output_tokens)

    def follow_slo(self, slo: SloConfig) -> None:
        """SLO targets reloaded: capacity is estimated at the new tightest TPOT."""
        self.sizer.tpot_s = tightest_tpot(slo)

    # -- the tick ------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start(self._run())

    async def close(self) -> None:
        await self._loop.stop()

    async def _run(self) -> None:
        seasonal = self.sizer.seasonal
        # statsmodels takes ~1.5 s to import: in a thread, and only once a seasonal model
        # could be fitted (`min_seasons` counted), not on every start
        fit_from = None
        if seasonal is not None:
            fit_from = self.wall() + seasonal.min_seasons * seasonal.season_s - seasonal.bucket_s
        while True:
            if fit_from is not None and self.wall() >= fit_from:
                await asyncio.to_thread(importlib.import_module, "statsmodels.tsa.holtwinters")
                fit_from = None
            try:
                self.tick()
            except Exception:  # a bug here must not stop sizing for good: logged, next tick
                log.exception("autoscale tick failed")
            await asyncio.sleep(self.config.interval_s)  # the period, not a synchronisation

    def tick(self) -> dict[str, PoolSize]:
        """Size every pool now, with the region's rates where peers share theirs."""
        now = self.wall()
        own = self.rates.own = self.sizer.own_rates(now)
        peers = self.rates.peers
        region = None
        if peers is not None:
            region = {pool: rate + peers.get(pool, 0.0) for pool, rate in own.items()}
        self.sizes = self.sizer.tick(now, region)
        counts = self.standby.promotions, self.standby.releases
        promoted, released = counts[0] - self._counted[0], counts[1] - self._counted[1]
        self._counted = counts
        if promoted or released:
            log.info(
                "standby backends brought in since the last tick: %d; sent back (pools quiet): %d; "
                "in now on this router's say-so: %s",
                promoted, released, ", ".join(self.standby.promoted()) or "none",
            )  # fmt: skip
        return self.sizes

    # -- what it shows -------------------------------------------------------------------------
    def describe(self) -> dict:
        """`GET /admin/autoscale` (`gpuroute scale` reads this schema)."""
        backends = self.sizer.scheduler.backends
        pools = {}
        for pool, size in sorted(self.sizes.items()):
            standby = self.standby.waiting(pool)
            pools[pool] = {
                "desired_backends": size.active,
                "desired_standby_backends": size.standby,
                "in_rotation": len(backends.routable(pool)),
                "standby": len(standby),
                "rate_rps": round(size.rate_rps, 6),
                "forecast_rps": round(size.forecast_rps, 6),
                "utilisation": round(size.utilisation, 6),
                "capacity_rps": round(size.capacity_rps, 6),
                "reason": size.reason,
            }
        return {"interval_s": self.config.interval_s, "pools": pools}
