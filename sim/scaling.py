"""Pools that grow and shrink in the simulator: the router's own sizing (FleetSizer, with
its seasonal model and warm standby) drives an executor that plays the autoscaling group.

Each model pool's engines are the scenario's [[gpus]] serving it, in order: the most the
group may run. An engine off is out of the router's backend set and costs nothing. A pool
short of its active size takes its warm standby into service at once (a warm pool), then
boots engines: each joins after `boot_s + model_load_s`, in slow start, or as standby
while the active size is met. A pool over its size stops booting ones first, then its
standby, then drains active ones (least busy first): they take nothing new and power off
once empty, so scale-in loses no request. An active engine beyond the size goes back to
standby while standby is short (router/core/scale_targets.py follow_plan). GPU-hours
count every engine from its boot to its power-off."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import numpy as np
from gpuroute.router.config.autoscale import AutoscaleConfig
from gpuroute.router.core.autoscale import AutoscaleSettings, PoolSize
from gpuroute.router.core.backend import ROUTABLE_STATES, Backend, BackendState
from gpuroute.router.core.fleet_sizer import FleetSizer
from gpuroute.router.core.scale_targets import PoolTarget, follow_plan
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.core.seasonal import SeasonalSettings
from gpuroute.router.core.slo import SloClass
from gpuroute.router.core.standby import StandbyRotation
from gpuroute.sim.daily import DailySection
from gpuroute.sim.engine_model import EngineModel
from gpuroute.sim.events import EventHeap
from pydantic import Field

if TYPE_CHECKING:  # (sim.fleet imports the scenario, which imports this module)
    from gpuroute.sim.fleet import GpuTypeProfile

SCALE, BOOTED = -4, -5  # event kinds (sim/simulator.py's are -1 to -3)
IN_SERVICE = "autoscale: in service"
TO_STANDBY = "autoscale: warm standby"
SCALE_IN = "autoscale: scale-in"
STANDBY = frozenset({BackendState.STANDBY})


class ScenarioAutoscale(AutoscaleConfig):
    """A scenario's `[autoscale]`: the router's section (off unless enabled here) and what
    the simulator must know of the machines."""

    enabled: bool = False
    boot_s: float = Field(default=120.0, ge=0)  # instance start to a running engine
    model_load_s: float = Field(default=60.0, ge=0)  # weights onto the GPU
    lead_time_s: float | None = Field(default=None, ge=0)  # default: boot_s + model_load_s
    initial_backends: int | None = Field(default=None, ge=0)  # default: min_backends
    # whole days of arrivals the seasonal model has seen before the run (drawn from the
    # workload's daily shape; a router keeps its own)
    history_days: int = Field(default=2, ge=0, le=28)

    def lead(self) -> float:
        return self.boot_s + self.model_load_s if self.lead_time_s is None else self.lead_time_s

    def settings(self, lead_time_s: float | None = None) -> AutoscaleSettings:
        return super().settings(self.lead() if lead_time_s is None else lead_time_s)


class ScaledRun(Protocol):
    """What the executor drives of its run (sim/simulator.py's RegionalRun): the router's
    scheduler over the engines' backends, the engines, the event heap and the SLO classes."""

    scheduler: Scheduler
    backends: list[Backend]
    engines: list[EngineModel]
    engine_profiles: list[GpuTypeProfile]
    classes: list[SloClass]
    heap: EventHeap
    peak_rps: float  # the workload's rate (a daily shape's peak)

    def offer_room(self, now: float) -> None: ...


class ScalingFleet:
    """The executor: the run's engines switched on and off to follow the sizer."""

    def __init__(
        self,
        run: ScaledRun,
        config: ScenarioAutoscale,
        daily: DailySection | None,
        mix: dict[str, float],
        seed: int,
    ) -> None:
        """`daily`, `mix`, `seed`: the scenario's daily shape, model mix and seed."""
        self.run, self.config = run, config
        self.daily, self.mix, self.seed = daily, mix, seed
        seasonal = None
        if config.seasonal.enabled and daily is not None:
            c = config.seasonal
            seasonal = SeasonalSettings(
                daily.day_s, c.buckets_per_season, c.min_seasons, c.max_seasons
            )
        self.standby = StandbyRotation(run.scheduler.backends, config.release_after_s)
        tpot = min(c.tpot_s for c in run.classes)
        self.sizer = FleetSizer(
            run.scheduler,
            config.settings(),
            tpot_s=tpot,
            capacity_rps=config.capacity_rps,
            seasonal=seasonal,
            standby=self.standby,
        )
        self.pools: dict[str, list[int]] = {}  # model -> its engines, in [[gpus]] order
        for e, backend in enumerate(run.backends):
            self.pools.setdefault(next(iter(backend.models)), []).append(e)
        self.booting: dict[int, float] = {}  # engine -> when it joins
        self.on_since: dict[int, float] = {}  # engines powered (booting, standby, serving)
        self.seconds_on = [0.0] * len(run.backends)  # each engine's, powered off so far
        self.drained_busy = 0  # engines set draining with requests still on them
        self.timeline: list[tuple[float, str, int, int]] = []  # (t, pool, active, standby)

    # -- start -------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Every pool at its first size (`initial_backends`, else what the day's first rate
        needs at the high mark, as a fleet that was running), its standby warm."""
        c, backends = self.config, self.run.scheduler.backends
        for pool, engines in self.pools.items():
            rate = self.first_rate(pool)
            initial = self._first_size(pool, rate)
            self.sizer.scaler.start(pool, now, rate, initial)
            for k, e in enumerate(engines):
                backend = self.run.backends[e]
                if k < initial + c.standby_backends:
                    self.on_since[e] = now
                    if k >= initial:
                        backends.set_state(backend, BackendState.STANDBY, now, TO_STANDBY)
                else:
                    backends.remove(backend.backend_id)
        self.run.heap.push(now, SCALE)

    def first_rate(self, pool: str) -> float:
        """The pool's arrival rate at the start: its share of the workload's rate, at the
        daily shape's first hour."""
        daily = self.daily
        share = self.mix.get(pool, 0.0)
        level = float(daily.relative_rate(np.zeros(1))[0]) if daily is not None else 1.0
        return self.run.peak_rps * share * level

    def _first_size(self, pool: str, rate: float) -> int:
        c = self.config
        if c.initial_backends is not None:
            return c.initial_backends
        need = math.ceil(rate / (self.sizer.capacity(pool) * c.scale_up_utilisation) - 1e-9)
        return min(max(need, c.min_backends), len(self.pools[pool]) - c.standby_backends)

    def seed_history(self, start: float) -> None:
        """The seasonal model's history: `history_days` earlier days of the workload's
        daily shape (its flash crowds left out), drawn as Poisson counts at its rate, as
        the router would have counted them; each pool gets its share of the models' mix."""
        daily = self.daily
        if self.sizer.seasonal is None or daily is None or not self.config.history_days:
            return
        plain = daily.model_copy(update={"crowds": []})
        span = self.config.history_days * daily.day_s
        grid = np.arange(0.0, span, 1.0)
        rng = np.random.default_rng(self.seed ^ 0x5EA5)
        counts = rng.poisson(plain.relative_rate(grid) * self.run.peak_rps)
        for model, share in self.mix.items():
            if model not in self.pools:
                continue
            history = self.sizer.history_of(model)
            for t, count in zip(grid[counts > 0], counts[counts > 0], strict=True):
                history.arrive(start - span + float(t), float(count) * share)

    # -- events ------------------------------------------------------------------------------
    def on_event(self, kind: int, payload: int, now: float, more: bool) -> None:
        if kind == SCALE:
            self.tick(now, more)
        else:
            self.booted(payload, now)

    def tick(self, now: float, more: bool) -> None:
        sizes = self.sizer.tick(now)
        for pool, engines in self.pools.items():
            size = sizes.get(pool)
            if size is not None:
                self.follow(pool, engines, size, now)
        if more:
            self.run.heap.push(now + self.config.interval_s, SCALE)

    def booted(self, e: int, now: float) -> None:
        if self.booting.pop(e, None) is None:
            return  # cancelled while it booted
        pool = next(iter(self.run.backends[e].models))
        engines = self.pools[pool]
        size = self.sizer.scaler.last(pool)
        active = len(self._in(engines, ROUTABLE_STATES))
        backend = self.run.backends[e]
        self.run.engines[e].recover(now)
        self.run.scheduler.backends.add(backend, now, warm=True)
        if size is not None and active >= size.active:
            self.run.scheduler.backends.set_state(backend, BackendState.STANDBY, now, TO_STANDBY)
        self.run.offer_room(now)

    def finished(self, e: int, now: float) -> None:
        """A request left engine `e`: a draining one powers off once empty."""
        backend = self.run.backends[e]
        if backend.reason == SCALE_IN and backend.in_flight == 0 and e in self.on_since:
            self._power_off(e, now)

    # -- following the sizer -----------------------------------------------------------------
    def follow(self, pool: str, engines: list[int], size: PoolSize, now: float) -> None:
        """One step toward the pool's size, as an autoscaling group takes it (follow_plan)."""
        backends = self.run.scheduler.backends
        rotation, standby = self._in(engines, ROUTABLE_STATES), self._in(engines, STANDBY)
        booting = self.booting.keys() & set(engines)
        plan = follow_plan(
            len(rotation), len(standby), len(booting), PoolTarget(size.active, size.standby)
        )
        for e in standby[: plan.activate]:  # the warm pool goes in
            backends.set_state(self.run.backends[e], BackendState.READY, now, IN_SERVICE)
        rotation = self._in(engines, ROUTABLE_STATES)
        least_busy = sorted(rotation, key=lambda e: (self.run.backends[e].in_flight, -e))
        for e in least_busy[: plan.to_standby]:  # they finish what they have
            backends.set_state(self.run.backends[e], BackendState.STANDBY, now, TO_STANDBY)
        self._boot(engines, plan.boot, now)
        for e in sorted(booting, key=self.booting.get, reverse=True)[: plan.cancel]:
            del self.booting[e]
            self._account(e, now)
        for e in standby[plan.activate :][::-1][: plan.stop_standby]:
            self._power_off(e, now)
        for e in least_busy[plan.to_standby :][: plan.drain]:
            self.drained_busy += self.run.backends[e].in_flight > 0
            backends.set_state(self.run.backends[e], BackendState.DRAINING, now, SCALE_IN)
            self.finished(e, now)
        active, warm = len(self._in(engines, ROUTABLE_STATES)), len(self._in(engines, STANDBY))
        self.timeline.append((now, pool, active, warm))

    def _in(self, engines: list[int], states: frozenset[BackendState]) -> list[int]:
        """The pool's engines on and in one of `states`."""
        backends = self.run.scheduler.backends
        return [
            e
            for e in engines
            if self.run.backends[e].backend_id in backends and self.run.backends[e].state in states
        ]

    def _boot(self, engines: list[int], count: int, now: float) -> None:
        off = [e for e in engines if e not in self.on_since]
        for e in off[:count]:
            self.on_since[e] = now
            self.booting[e] = now + self.config.boot_s + self.config.model_load_s
            self.run.heap.push(self.booting[e], BOOTED, e)

    def _power_off(self, e: int, now: float) -> None:
        backend = self.run.backends[e]
        if backend.backend_id in self.run.scheduler.backends:
            self.run.scheduler.backends.remove(backend.backend_id)
        self.run.engines[e].crash(now)  # empty: nothing is lost, its caches go
        self._account(e, now)

    def _account(self, e: int, now: float) -> None:
        self.seconds_on[e] += now - self.on_since.pop(e)

    def close(self, end: float) -> dict[str, float]:
        """GPU-hours and cost until `end` (every engine still on powered off then)."""
        for e in list(self.on_since):
            self._account(e, end)
        return fleet_figures(self.run, self.seconds_on)


def fleet_figures(run: ScaledRun, seconds_on: list[float]) -> dict[str, float]:
    """GPU-hours and cost of engines on for these many seconds each (each engine's GPUs at
    its type's price)."""
    seconds = np.asarray(seconds_on) * np.array([b.gpus for b in run.backends], dtype=float)
    prices = np.array([p.params.gpu.price_per_hour or 0.0 for p in run.engine_profiles])
    return {
        "gpu_hours": float(seconds.sum() / 3600.0),
        "cost_usd": float(seconds @ prices / 3600.0),
    }


def fixed_fleet_hours(run: ScaledRun, start: float, end: float) -> dict[str, float]:
    """The same figures for a fleet whose every engine runs from `start` to `end`."""
    return fleet_figures(run, [end - start] * len(run.backends))


__all__ = ["BOOTED", "SCALE", "ScalingFleet", "ScenarioAutoscale"]
