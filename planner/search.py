"""One model pool's search for a fleet (planner/plan.py): mixes of backends in order of cost,
each checked in the simulator at the pool's peak, and the best a budget buys."""

from __future__ import annotations

import itertools
import math
from typing import Protocol

import numpy as np
from gpuroute.planner.check import GpuOption, PlanError
from gpuroute.sim.workloads import Workload

MOST_MIXES = 200_000  # mixes enumerated per pool at most (before sorting)

Mix = tuple[int, ...]  # backends per option, in the options' order


class SearchLimits(Protocol):
    """The plan's limits a search keeps to (plan.py's PlanLimits)."""

    @property
    def attainment(self) -> float: ...
    @property
    def max_backends(self) -> int: ...
    @property
    def max_runs(self) -> int: ...


class PoolRunner(Protocol):
    """What a search asks of the planner (plan.py's Planner): its limits, and the SLO
    attainment of one pool's mix run in the simulator at a rate."""

    @property
    def limits(self) -> SearchLimits: ...

    def run_pool(self, model: str, options: list[GpuOption], mix: Mix, rate: float) -> float: ...


def one_less(mix: Mix, i: int) -> Mix:
    """`mix` with one backend less of its `i`th type."""
    return (*mix[:i], mix[i] - 1, *mix[i + 1 :])


def cost_of(options: list[GpuOption], mix: Mix) -> float:
    return sum(o.price_per_hour * n for o, n in zip(options, mix, strict=True))


class MixSearch:
    """One pool's mixes in order of cost, each checked in the simulator at the peak."""

    def __init__(
        self,
        planner: PoolRunner,
        model: str,
        options: list[GpuOption],
        rates: list[float],
        peak: float,
    ) -> None:
        self.planner, self.model, self.options = planner, model, options
        self.rates, self.peak = rates, peak
        self.runs = 0

    def meets(self, mix: Mix) -> bool:
        if sum(mix) == 0:
            return False
        self.runs += 1
        attainment = self.planner.run_pool(self.model, self.options, mix, self.peak)
        return attainment >= self.planner.limits.attainment

    def candidates(self) -> list[Mix]:
        """Mixes whose estimated SLO capacity covers the peak, cheapest first."""
        most = self.planner.limits.max_backends
        ranges = [
            range(min(most, math.ceil(self.peak / r) + 1) + 1) if r > 0 else range(1)
            for r in self.rates
        ]
        found = []
        for mix in itertools.islice(itertools.product(*ranges), MOST_MIXES):
            if 0 < sum(mix) <= most and np.dot(mix, self.rates) >= self.peak:
                found.append(mix)
        return sorted(found, key=lambda m: (cost_of(self.options, m), -np.dot(m, self.rates), m))

    def cheapest(self) -> Mix:
        """The first candidate that meets, trimmed; PlanError when the run cap comes first."""
        for mix in self.candidates():
            if self.runs >= self.planner.limits.max_runs:
                break
            if self.meets(mix):
                return self.trim(mix)
        raise PlanError(
            f"model {self.model!r}: no mix of {', '.join(o.label for o in self.options)} up to "
            f"{self.planner.limits.max_backends} backends met the SLO at {self.peak:.1f} req/s "
            f"within {self.planner.limits.max_runs} simulator runs"
        )

    def trim(self, mix: Mix) -> Mix:
        """One backend less of a type while the pool still meets (scarcest, dearest first) and
        runs are left."""
        while self.runs < self.planner.limits.max_runs:
            order = sorted(
                (i for i, n in enumerate(mix) if n),
                key=lambda i: (mix[i], -self.options[i].price_per_hour),
            )
            for i in order:
                if self.runs >= self.planner.limits.max_runs:
                    return mix  # (the cap holds inside a round too)
                fewer = one_less(mix, i)
                if self.meets(fewer):
                    mix = fewer
                    break
            else:
                return mix
        return mix

    def without_one(self, mix: Mix) -> dict[str, float]:
        out = {}
        for i, n in enumerate(mix):
            if n:
                fewer = one_less(mix, i)
                attainment = (
                    self.planner.run_pool(self.model, self.options, fewer, self.peak)
                    if sum(fewer)
                    else 0.0
                )
                out[self.options[i].label] = attainment
        return out

    def best_within(self, budget: float) -> Mix | None:
        """The affordable mix with the most estimated SLO capacity (cheaper on a tie)."""
        most = self.planner.limits.max_backends
        ranges = [range(min(most, math.floor(budget / o.price_per_hour)) + 1) for o in self.options]
        affordable = [
            mix
            for mix in itertools.islice(itertools.product(*ranges), MOST_MIXES)
            if 0 < sum(mix) <= most and cost_of(self.options, mix) <= budget + 1e-9
        ]
        if not affordable:
            return None
        return max(affordable, key=lambda m: (np.dot(m, self.rates), -cost_of(self.options, m)))


def token_costs(workload: Workload, peak: float, cost: float) -> tuple[float, float]:
    """$ per million tokens (prompt and output) and per million output tokens at the peak."""
    per_hour = peak * 3600
    tokens = per_hour * float(np.mean(workload.prompts + workload.outputs))
    outputs = per_hour * float(np.mean(workload.outputs))
    return round(cost / tokens * 1e6, 4), round(cost / outputs * 1e6, 4)
