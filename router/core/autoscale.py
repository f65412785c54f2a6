"""How many backends each model pool should have (sans-IO): the number a router exports as
`gpuroute_pool_desired_backends{pool}` and the simulator's scaling pools follow.

A pool's demand is its arrival rate, smoothed, with its trend; its supply is its backends'
SLO capacity (requests/s each serves within the SLO: `backend_capacity_rps`, or a measured
figure from `gpuroute plan` in the config). Utilisation is demand over supply.

- Up early: the size grows as soon as the demand expected one lead time ahead (boot plus
  model load: what a new backend takes to serve) would put the pool above
  `scale_up_utilisation`, to the size that brings it back to that mark. Requests held by
  the SLO gate prove the estimate optimistic: the pool then grows by one whatever it says.
- Down slowly: the size shrinks to what the highest demand of the last
  `scale_down_after_s` (and the forecast) needs at the high mark, once that window has
  passed since the last change; a pool below `scale_down_utilisation` (a quiet spell) does
  not wait. A size that would go straight back up is never chosen.
- Warm standby backends are counted on top, so a flash crowd has warm engines to take
  before new ones boot (router/core/standby.py).

A band (grow above 80 %, shrink below 30 % to its middle) holds a pool between the marks,
about 1.3 to 1.5 times the GPUs this tracking needs over a day (docs/autoscaling.md)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuroute.router.core.latency_prior import LatencyPrior


@dataclass(frozen=True, slots=True)
class AutoscaleSettings:
    scale_up_utilisation: float = 0.8  # the seeds' 80 % of SLO capacity
    scale_down_utilisation: float = 0.3  # and their 30 %
    scale_down_after_s: float = 300.0  # below the low mark this long before shrinking
    lead_time_s: float = 300.0  # boot plus model load: how far ahead demand is forecast
    standby_backends: int = 1  # warm, model loaded, out of rotation: on top of the active
    min_backends: int = 1  # active backends never fewer
    max_backends: int = 1024  # active plus standby never more
    rate_window_s: float = 30.0  # time constant of the smoothed arrival rate
    trend_window_s: float = 120.0  # and of its slope

    def __post_init__(self) -> None:
        if not 0 < self.scale_down_utilisation < self.scale_up_utilisation <= 1:
            raise ValueError("need 0 < scale_down_utilisation < scale_up_utilisation <= 1")
        if self.min_backends < 0 or self.standby_backends < 0:
            raise ValueError("min_backends and standby_backends must be >= 0")
        if self.max_backends < max(self.min_backends + self.standby_backends, 1):
            raise ValueError("max_backends must hold min_backends plus standby_backends")
        if min(self.rate_window_s, self.trend_window_s) <= 0 or self.lead_time_s < 0:
            raise ValueError("windows must be > 0 and lead_time_s >= 0")

    @property
    def settle_utilisation(self) -> float:
        """Where a shrinking pool lands: the middle of the band."""
        return (self.scale_up_utilisation + self.scale_down_utilisation) / 2


class ArrivalRate:
    """A pool's arrival rate and its slope, smoothed in continuous time (Holt's two
    exponential averages with time constants): arrivals come in as counts at any spacing,
    so a router's ticks and the simulator's events read the same rate."""

    __slots__ = ("_count", "_last", "_window", "primed", "rate", "slope", "trend_window")

    def __init__(self, window_s: float, trend_window_s: float) -> None:
        self._window, self.trend_window = window_s, trend_window_s
        self._count = 0.0  # arrivals since the last update
        self._last: float | None = None
        self.rate = 0.0  # requests/s
        self.slope = 0.0  # requests/s per second
        self.primed = False  # an estimate exists (a first interval, or `start`)

    def start(self, rate: float, now: float) -> None:
        """Begin from a known rate (a fleet that was running before)."""
        self.rate, self.primed, self._last, self._count = rate, True, now, 0.0

    def arrive(self, count: float = 1.0) -> None:
        self._count += count

    def update(self, now: float) -> float:
        """Fold in the arrivals since the last update; returns the smoothed rate."""
        if self._last is None:  # arrivals before the first update span an unknown time
            self._last, self._count = now, 0.0
            return self.rate
        dt = now - self._last
        if dt <= 0:
            return self.rate
        observed = self._count / dt
        self._count, self._last = 0.0, now
        if self.primed is False:  # the first interval is the first estimate, not 0
            self.rate, self.primed = observed, True
            return self.rate
        keep = math.exp(-dt / self._window)
        before = self.rate
        # the trend carried over a gap may overshoot below zero after a burst: no rate is
        self.rate = max(keep * (before + self.slope * dt) + (1 - keep) * observed, 0.0)
        keep_slope = math.exp(-dt / self.trend_window)
        self.slope = keep_slope * self.slope + (1 - keep_slope) * (self.rate - before) / dt
        return self.rate

    def ahead(self, seconds: float) -> float:
        """The rate `seconds` from now if the trend holds (never below zero)."""
        return max(self.rate + self.slope * seconds, 0.0)


def slo_capacity_rps(
    prior: LatencyPrior, prompt_tokens: float, output_tokens: float, tpot_s: float
) -> float:
    """Requests/s one engine serves while its streams keep `tpot_s`: the largest batch whose
    decode step (prefill chunks riding along included, at the mean request) stays within
    it, bounded by the batch limit and the KV cache; each request costs its share of the
    steps its tokens take plus its prefill's excess over them."""
    output = max(output_tokens, 1.0)
    context = prompt_tokens + output / 2  # a stream's mean context while it decodes
    kv_batch = prior.kv_capacity_tokens / max(prompt_tokens + output, 1.0)
    largest = max(1, int(min(prior.max_num_seqs, kv_batch)))
    batch, step = 1, prior.decode_step_s(1, context)
    low, high = 1, largest
    while low <= high:  # the step grows with the batch: the largest within the bound
        mid = (low + high) // 2
        mid_step = prior.decode_step_s(mid, mid * context)
        if mid_step <= tpot_s:
            batch, step = mid, mid_step
            low = mid + 1
        else:
            high = mid - 1
    _total, excess = prior.prefill_s(prompt_tokens, step)
    per_request = output * step / batch + excess
    return 1.0 / per_request


def backend_capacity_rps(
    work_s: float, prior: LatencyPrior | None, prompt: float, output: float, tpot_s: float
) -> float:
    """One backend's SLO capacity in requests/s: its saturated throughput (1 / the GPU
    seconds the cost model charges the pool's mean request), bounded by what it serves
    while its streams keep the tightest TPOT (where the latency model knows the engine)."""
    saturated = 1.0 / max(work_s, 1e-9)
    if prior is None:
        return saturated
    return min(saturated, slo_capacity_rps(prior, prompt, output, tpot_s))


class MeanLengths:
    """A pool's mean request (prompt and output tokens), as requests finish: what one
    backend's capacity is estimated at. Exponentially weighted over about `weight`
    requests, so a shift in the traffic's mix shows within minutes."""

    __slots__ = ("output", "prompt", "seen", "weight")

    def __init__(self, prompt: float = 1000.0, output: float = 250.0, weight: int = 500):
        self.prompt, self.output, self.weight, self.seen = prompt, output, weight, 0

    def served(self, prompt_tokens: float, output_tokens: float) -> None:
        self.seen += 1
        alpha = 1.0 / min(self.seen, self.weight)
        self.prompt += alpha * (prompt_tokens - self.prompt)
        self.output += alpha * (output_tokens - self.output)


@dataclass(slots=True)
class PoolSize:
    """A pool's answer at one tick (what the metrics and `/admin/autoscale` show)."""

    active: int  # backends in rotation it should have
    standby: int  # warm standby on top
    rate_rps: float  # smoothed arrivals
    forecast_rps: float  # what it sized for: the demand expected one lead time ahead
    utilisation: float  # smoothed arrivals over the SLO capacity in rotation now
    reason: str
    capacity_rps: float  # one backend's SLO capacity it sized with

    @property
    def desired(self) -> int:
        return self.active + self.standby


@dataclass(slots=True)
class _PoolState:
    rate: ArrivalRate
    active: int | None = None  # the last answer (None: none yet)
    changed_at: float = -math.inf  # when the size last changed
    # (time, demand) of the last scale_down_after_s, demands decreasing: the window's max
    # is the first entry alive
    recent: deque[tuple[float, float]] = field(default_factory=deque)
    held: bool = False  # the SLO gate held one of its requests since the last tick
    last: PoolSize | None = None

    def remember(self, now: float, demand: float, window_s: float) -> float:
        """Add a demand; returns the highest of the window (a monotonic queue)."""
        recent = self.recent
        while recent and recent[-1][1] <= demand:
            recent.pop()
        recent.append((now, demand))
        while recent[0][0] < now - window_s:
            recent.popleft()
        return recent[0][1]


@dataclass
class PoolScaler:
    """Desired sizes for every pool a router serves. `arrive` as requests come, `held` when
    the SLO gate holds one, `size` on each tick; `forecast(pool, horizon_s)` adds a
    prediction (a seasonal model) the size may rise to meet, never fall to."""

    settings: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    forecast: Callable[[str, float], float | None] | None = None
    _pools: dict[str, _PoolState] = field(default_factory=dict)

    def _pool(self, pool: str) -> _PoolState:
        state = self._pools.get(pool)
        if state is None:
            s = self.settings
            state = self._pools[pool] = _PoolState(ArrivalRate(s.rate_window_s, s.trend_window_s))
        return state

    def arrive(self, pool: str, count: float = 1.0) -> None:
        self._pool(pool).rate.arrive(count)

    def held(self, pool: str) -> None:
        self._pool(pool).held = True

    def start(self, pool: str, now: float, rate_rps: float, active: int) -> None:
        """A pool already running `active` backends at `rate_rps` (the simulator's warm
        start; a router starts from what it sees)."""
        state = self._pool(pool)
        state.rate.start(rate_rps, now)
        state.active, state.changed_at = active, now

    def pools(self) -> list[str]:
        return sorted(self._pools)

    def last(self, pool: str) -> PoolSize | None:
        state = self._pools.get(pool)
        return None if state is None else state.last

    def own_rate(self, pool: str, now: float) -> float:
        """This router's smoothed arrival rate of `pool` at `now` (what it shares with its
        peers); `size` at the same `now` reads the same rate."""
        return self._pool(pool).rate.update(now)

    def size(
        self, pool: str, now: float, in_rotation: int, capacity_rps: float, rate_rps: float | None
    ) -> PoolSize:
        """The pool's size at `now`, given the backends in rotation, one backend's SLO
        capacity and, where replicas pool their arrivals, the region's rate (None: this
        router's own)."""
        s, state = self.settings, self._pool(pool)
        own = state.rate.update(now)
        scale = 1.0 if rate_rps is None or own <= 0 else rate_rps / own
        rate = own if rate_rps is None else rate_rps
        ahead = state.rate.ahead(s.lead_time_s) * scale
        predicted = self.forecast(pool, s.lead_time_s) if self.forecast else None
        forecast = max(rate, ahead, predicted or 0.0)
        capacity = max(capacity_rps, 1e-9)
        current = state.active if state.active is not None else max(in_rotation, s.min_backends)
        utilisation = rate / (max(in_rotation, 1) * capacity)
        need = math.ceil(forecast / (capacity * s.scale_up_utilisation) - 1e-9)
        reason = "steady"
        if state.held:
            need, reason = max(need, in_rotation + 1), "requests held by the SLO gate"
        highest = state.remember(now, forecast, s.scale_down_after_s)
        if need > current:
            active = need
            reason = reason if state.held else "demand ahead above the high mark"
        else:
            active, reason = self._shrink(state, now, current, (forecast, highest), capacity)
        room = s.max_backends - s.standby_backends
        active = min(max(active, s.min_backends), room)
        if active != state.active:
            state.changed_at = now
        state.active, state.held = active, False
        state.last = PoolSize(
            active, s.standby_backends, rate, forecast, utilisation, reason, capacity_rps
        )
        return state.last

    def _shrink(
        self,
        state: _PoolState,
        now: float,
        current: int,
        demand: tuple[float, float],
        capacity: float,
    ) -> tuple[int, str]:
        """Hold the size, or shrink it: to what the window's highest demand needs at the
        high mark once the window has passed since the last change; in a quiet spell (now's
        demand below the low mark) at once, to what now's demand needs."""
        s = self.settings
        now_demand, highest = demand
        if now_demand < current * capacity * s.scale_down_utilisation:
            fits = math.ceil(now_demand / (capacity * s.scale_up_utilisation) - 1e-9)
            return min(fits, current), "below the low mark"
        fits = math.ceil(highest / (capacity * s.scale_up_utilisation) - 1e-9)
        if fits >= current:
            return current, "steady"
        if now - state.changed_at < s.scale_down_after_s:
            return current, "demand fell, waiting out the window"
        return fits, "demand fell for a whole window"
