"""A router's pools sized on each tick (sans-IO): the arrivals it counts, the seasonal
model, each pool's backend SLO capacity and the warm standby it brought in, put together
the same way in the live router (router/scaling/autoscaler.py) and the simulator (sim/scaling.py).

A pool is a model: the backends serving it. One backend's capacity is the measured figure
the config gives for the pool (`gpuroute plan` prints it), else the estimate from the
router's own priors at the pool's mean request (`backend_capacity_rps`), averaged over the
pool's backends in rotation (all of them where none is)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuroute.router.core.autoscale import (
    AutoscaleSettings,
    MeanLengths,
    PoolScaler,
    PoolSize,
    backend_capacity_rps,
)
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.core.seasonal import SeasonalRate, SeasonalSettings
from gpuroute.router.core.standby import StandbyRotation


@dataclass(slots=True)
class PoolRates:
    """Arrivals per pool (requests/s) that a router's replicas share to size on one rate:
    its own, which its autoscaler writes each tick, and its peers' sum, which the shared-load
    board writes (None: no board, or it is down, and a router sizes with its own alone)."""

    own: dict[str, float] = field(default_factory=dict)
    peers: dict[str, float] | None = None


class FleetSizer:
    def __init__(
        self,
        scheduler: Scheduler,
        settings: AutoscaleSettings,
        *,
        tpot_s: float,
        capacity_rps: Mapping[str, float] | None = None,
        seasonal: SeasonalSettings | None = None,
        standby: StandbyRotation | None = None,
    ) -> None:
        self.scheduler, self.settings, self.tpot_s = scheduler, settings, tpot_s
        self.capacity_rps = dict(capacity_rps or {})
        self.seasonal = seasonal
        self.standby = standby
        self.scaler = PoolScaler(settings, self._forecast if seasonal else None)
        self.lengths: dict[str, MeanLengths] = {}
        self.history: dict[str, SeasonalRate] = {}
        self._now = 0.0

    # -- what happens between ticks ----------------------------------------------------------
    def arrive(self, model: str, now: float, count: float = 1.0) -> None:
        self.scaler.arrive(model, count)
        if self.seasonal is not None:
            self.history_of(model).arrive(now, count)

    def held(self, model: str) -> None:
        self.scaler.held(model)

    def served(self, model: str, prompt_tokens: float, output_tokens: float) -> None:
        lengths = self.lengths.get(model)
        if lengths is None:
            lengths = self.lengths[model] = MeanLengths()
        lengths.served(prompt_tokens, output_tokens)

    def history_of(self, model: str) -> SeasonalRate:
        history = self.history.get(model)
        if history is None:
            assert self.seasonal is not None
            history = self.history[model] = SeasonalRate(self.seasonal)
        return history

    def _forecast(self, pool: str, horizon_s: float) -> float | None:
        history = self.history.get(pool)
        return None if history is None else history.forecast(self._now, horizon_s)

    # -- the tick ----------------------------------------------------------------------------
    def pools(self) -> list[str]:
        """Every model some backend serves (in any state), and any that had arrivals."""
        served = {m for b in self.scheduler.backends for m in b.models}
        return sorted(served | set(self.scaler.pools()))

    def own_rates(self, now: float) -> dict[str, float]:
        """Each pool's arrival rate at this router alone, at `now` (replicas add theirs up
        into the `region_rps` a tick at the same `now` takes)."""
        return {pool: self.scaler.own_rate(pool, now) for pool in self.pools()}

    def tick(
        self, now: float, region_rps: Mapping[str, float] | None = None
    ) -> dict[str, PoolSize]:
        """Each pool's size now (`region_rps`: the region's arrival rates, where replicas
        pool theirs), after sending back the standby backends of quiet pools."""
        self._now = now
        if self.standby is not None:
            for model in self.standby.take_wanted():  # a promotion is a hold avoided
                self.scaler.held(model)
        sizes = {}
        for pool in self.pools():
            rotation = self.scheduler.backends.routable(pool)
            rate = None if region_rps is None else region_rps.get(pool, 0.0)
            sizes[pool] = self.scaler.size(pool, now, len(rotation), self.capacity(pool), rate)
        if self.standby is not None:
            self.standby.release(now, lambda b: self._quiet_without(b, sizes))
        return sizes

    def capacity(self, pool: str) -> float:
        """One backend's SLO capacity in the pool, in requests/s."""
        if pool in self.capacity_rps:
            return self.capacity_rps[pool]
        backends = self.scheduler.backends
        members = [b for b in backends.routable(pool)] or [b for b in backends if pool in b.models]
        if not members:
            return 1.0  # nothing serves it: any finite figure sizes it from zero
        lengths = self.lengths.get(pool) or MeanLengths()
        return sum(self._one(b, lengths) for b in members) / len(members)

    def _one(self, backend: Backend, lengths: MeanLengths) -> float:
        work = self.scheduler.estimator.seconds(
            backend.gpu_type, backend.capacity, lengths.prompt, lengths.output
        )
        latency = self.scheduler.latency
        prior = None if latency is None else latency.priors.get(backend.gpu_type)
        return backend_capacity_rps(work, prior, lengths.prompt, lengths.output, self.tpot_s)

    def _quiet_without(self, backend: Backend, sizes: Mapping[str, PoolSize]) -> bool:
        """Whether every pool `backend` serves would stay below the low mark without it."""
        low = self.settings.scale_down_utilisation
        for pool in backend.models:
            size = sizes.get(pool)
            if size is None:
                continue
            left = len(self.scheduler.backends.routable(pool)) - 1
            if left < 1 or size.rate_rps >= left * size.capacity_rps * low:
                return False
        return True
