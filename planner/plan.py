"""`gpuroute plan`: the cheapest fleet of the given GPU types that meets a scenario's SLO at
a planned peak, found and checked in the simulator with the router's default policy.

Per model pool (each model of the workload, offered its share of the peak): first the
roofline rules out what no count of GPUs can serve (planner/check.py); then each usable
type's SLO capacity per backend is measured by `CapacitySearch` on a homogeneous pool sized
for the peak; the mixes whose estimated capacity covers the pool's peak are tried in order of
cost, each verified by a simulator run at the peak, and the first that meets the target is
trimmed (one backend less of a type, scarcest first, while it still meets). The result is a
fleet from which removing any one backend misses. Runs are capped; all is deterministic
(the scenario's seed). The whole fleet is then run once more at the peak, as it would serve."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuroute.planner.check import GpuOption, PlanError, engine_params, usable_options
from gpuroute.planner.search import Mix, MixSearch, cost_of, token_costs
from gpuroute.sim.capacity import CapacitySearch
from gpuroute.sim.fleet import GpuTypeProfile, profile_gpu_type
from gpuroute.sim.prepare import prepare_workload
from gpuroute.sim.report import PolicyReport
from gpuroute.sim.scenario import GpuGroup, LoadedScenario, Scenario
from gpuroute.sim.simulator import FleetSimulator

from gpuroute.gpus import GPUS_CONTEXT, GpuCatalog

POLICY = "default"
CAPACITY_ITERATIONS = 5  # bisection steps of each type's per-backend capacity (±1.5 %)


@dataclass(frozen=True, slots=True)
class PlanLimits:
    attainment: float = 0.9
    max_backends: int = 64  # per pool
    max_runs: int = 40  # simulator runs per pool's mix search (capacity searches apart)


@dataclass(slots=True)
class PoolPlan:
    model: str
    peak_rps: float
    backends: dict[str, int]  # option label -> count
    cost_per_hour: float
    attainment: float  # the pool alone at its peak
    meets: bool
    capacity_per_backend_rps: dict[str, float]
    without_one: dict[str, float]  # attainment with one backend of a type less
    runs: int
    notes: list[str] = field(default_factory=list)
    # every mix the search ran at the peak: (backends, cost per hour, attainment)
    tried: list[tuple[dict[str, int], float, float]] = field(default_factory=list)


@dataclass(slots=True)
class FleetPlan:
    scenario: str
    peak_rps: float
    attainment_target: float
    pools: list[PoolPlan]
    cost_per_hour: float
    cost_per_million_tokens: float  # prompt and output tokens served at the peak
    cost_per_million_output_tokens: float
    attainment: float  # the whole fleet at the peak
    meets: bool
    scarcest: str | None  # the type of which the fleet has fewest backends
    attainment_without_one_scarcest: float | None
    budget_per_hour: float | None = None
    within_budget: bool = True
    by_model: dict[str, dict[str, float]] = field(default_factory=dict)
    # over budget: what the budget buys instead (most estimated capacity), run at the peak
    budget_fleet: BudgetFleet | None = None
    # each pool judged on its own in the whole fleet's run: its model's requests' attainment
    # (of their own SLO), the pools short of the target, and per model and SLO class
    pool_attainment: dict[str, float] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    by_model_and_class: list[dict[str, object]] = field(default_factory=list)
    # the pool that lost the scarcest type's backend, and every pool judged again then
    scarcest_pool: str | None = None
    without_one_scarcest_by_pool: dict[str, float] = field(default_factory=dict)
    misses_without_one_scarcest: list[str] = field(default_factory=list)


@dataclass(slots=True)
class BudgetFleet:
    backends: dict[str, dict[str, int]]  # model -> option label -> count
    cost_per_hour: float
    attainment: float


@dataclass(slots=True)
class Judged:
    """A fleet run whole at the peak, each model's pool judged against the target."""

    attainment: float
    pools: dict[str, float]  # model -> attainment of its requests
    misses: list[str]  # the models whose pools miss the target
    meets: bool  # the fleet and every pool
    by_model: dict[str, dict[str, float]]
    by_model_and_class: list[dict[str, object]]


class Planner:
    """Plans one scenario's fleet; every simulator run is remembered by its fleet."""

    def __init__(
        self,
        loaded: LoadedScenario,
        options: list[GpuOption],
        limits: PlanLimits,
        on_run: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_run`: called after each simulator run (a progress step)."""
        if loaded.scenario.global_ is not None:
            raise PlanError(f"{loaded.source}: plan sizes one region; drop [global]")
        self.loaded, self.options, self.limits = loaded, options, limits
        self.on_run = on_run
        self.scenario = loaded.scenario.model_copy(update={"faults": []})
        self.workload, _, self.base_rate = prepare_workload(loaded)
        self._profiles: dict[tuple[str, str], GpuTypeProfile] = {}
        self._runs: dict[tuple[str, Mix, float], PolicyReport] = {}
        self.searches: dict[str, MixSearch] = {}

    def profile(self, option: GpuOption, model: str) -> GpuTypeProfile:
        key = (option.label, model)
        if key not in self._profiles:
            params = engine_params(self.scenario, option, model)
            self._profiles[key] = profile_gpu_type(params, self.workload)
        return self._profiles[key]

    def fleet(self, pools: dict[str, dict[GpuOption, int]]) -> Scenario:
        """The scenario with these pools as its [[gpus]]."""
        return self.scenario.model_copy(update={"gpus": self.gpu_groups(pools)})

    def gpu_groups(self, pools: dict[str, dict[GpuOption, int]]) -> list[GpuGroup]:
        return gpu_groups(pools, self.scenario.gpu_catalog())

    def simulator(self, scenario: Scenario, rate: float) -> FleetSimulator:
        default = scenario.workload.model
        profiles = {
            g.kind(default).key(default): self.profile(
                self.option_of(g.type, g.tensor_parallel), g.model or default
            )
            for g in scenario.gpus
        }
        loaded = LoadedScenario(scenario, self.loaded.base_dir, self.loaded.source)
        workload = self.workload.rescaled(rate / self.base_rate)
        return FleetSimulator(loaded, (workload, profiles, rate))

    def options_for(self, model: str) -> list[GpuOption]:
        """The options `model`'s pool was planned with (a bare type at the TP the model
        starts on), or the given ones before it was planned."""
        search = self.searches.get(model)
        return self.options if search is None else search.options

    def option_of(self, gpu: str, tp: int) -> GpuOption:
        """The option of these GPUs: given, or a bare type widened for a model that needs
        more GPUs per engine (plan_check._widened), at the same price per GPU."""
        given = [o for o in self.options if o.gpu == gpu]
        exact = next((o for o in given if o.tp == tp), None)
        if exact is not None:
            return exact
        return GpuOption(gpu, tp, given[0].price_per_hour / given[0].tp * tp, False)

    def judge(self, pools: dict[str, dict[GpuOption, int]], peak: float) -> Judged:
        """The fleet of these pools run whole at the peak; a pool left without a backend
        serves none of its requests."""
        if not any(n for mix in pools.values() for n in mix.values()):
            return Judged(0.0, dict.fromkeys(pools, 0.0), list(pools), False, {}, [])
        report = self.simulator(self.fleet(pools), peak).run(POLICY)
        met = {m: float(s["attainment"]) for m, s in report.by_model.items()}
        met = met or {next(iter(pools)): report.slo_attainment}
        target = self.limits.attainment
        misses = [m for m in pools if met.get(m, 0.0) < target]
        return Judged(
            attainment=report.slo_attainment,
            pools=met,
            misses=misses,
            meets=report.slo_attainment >= target and not misses,
            by_model=report.by_model,
            by_model_and_class=report.by_model_and_class,
        )

    def pool_scenario(self, model: str, mix: dict[GpuOption, int]) -> Scenario:
        """A scenario of one model's pool alone, its traffic that model's only."""
        workload = self.scenario.workload.model_copy(update={"model": model, "models": {}})
        models = [m.model_copy(update={"fallback": []}) for m in self.scenario.models]
        update = {"workload": workload, "models": models, "gpus": self.gpu_groups({model: mix})}
        return self.scenario.model_copy(update=update)

    def run_pool(self, model: str, options: list[GpuOption], mix: Mix, rate: float) -> float:
        key = (model, mix, round(rate, 6))
        if key not in self._runs:
            scenario = self.pool_scenario(model, dict(zip(options, mix, strict=True)))
            self._runs[key] = self.simulator(scenario, rate).run(POLICY)
            self.on_run()
        return self._runs[key].slo_attainment

    def per_backend_rps(self, model: str, option: GpuOption, peak: float) -> float:
        """SLO capacity per backend of `option` in a homogeneous pool sized for `peak`."""
        saturated = self.profile(option, model).capacity_rps
        count = min(self.limits.max_backends, max(1, math.ceil(peak / saturated)))
        base = self.simulator(self.pool_scenario(model, {option: count}), peak)
        search = CapacitySearch(base, POLICY, self.limits.attainment, on_run=self.on_run)
        utilization = search.capacity(CAPACITY_ITERATIONS)
        return utilization * saturated

    def plan_pool(self, model: str, peak: float) -> PoolPlan:
        options, notes = usable_options(
            self.scenario, self.options, model, self.workload, self.limits.attainment
        )
        rates = [self.per_backend_rps(model, o, peak) for o in options]
        if not any(rates):
            raise PlanError(
                f"model {model!r}: no backend of {', '.join(o.label for o in options)} meets "
                f"the SLO at {self.limits.attainment:.0%} even at light load"
            )
        search = self.searches[model] = MixSearch(self, model, options, rates, peak)
        mix = search.cheapest()
        return PoolPlan(
            model=model,
            peak_rps=round(peak, 3),
            backends={o.label: n for o, n in zip(options, mix, strict=True) if n},
            cost_per_hour=round(cost_of(options, mix), 4),
            attainment=(attainment := self.run_pool(model, options, mix, peak)),
            meets=attainment >= self.limits.attainment,
            capacity_per_backend_rps={
                o.label: round(r, 3) for o, r in zip(options, rates, strict=True)
            },
            without_one=search.without_one(mix),
            runs=search.runs,
            notes=notes,
            tried=self.tried(model, options, peak),
        )

    def tried(
        self, model: str, options: list[GpuOption], peak: float
    ) -> list[tuple[dict[str, int], float, float]]:
        rows = [
            ({o.label: n for o, n in zip(options, mix, strict=True) if n},
             round(cost_of(options, mix), 4), report.slo_attainment)
            for (m, mix, rate), report in self._runs.items()
            if m == model and rate == round(peak, 6)
        ]  # fmt: skip
        return sorted(rows, key=lambda row: (row[1], row[2]))


def plan_fleet(
    loaded: LoadedScenario,
    options: list[GpuOption],
    limits: PlanLimits,
    peak_rps: float | None = None,
    budget_per_hour: float | None = None,
) -> FleetPlan:
    """The cheapest fleet meeting the SLO at the peak (the scenario's own rate by default),
    pool by pool, then run whole at the peak and once more with one backend of its scarcest
    type less; each pool judged against the target on its own."""
    return plan_with(Planner(loaded, options, limits), peak_rps, budget_per_hour)


def plan_with(
    planner: Planner, peak_rps: float | None = None, budget_per_hour: float | None = None
) -> FleetPlan:
    """`plan_fleet` with a planner of one's own (to run the fleet as written after)."""
    peak = peak_rps if peak_rps is not None else planner.base_rate
    mix = planner.scenario.model_mix()
    pools = [planner.plan_pool(model, peak * share) for model, share in mix.items()]
    chosen = chosen_mixes(pools, planner)
    whole = planner.judge(chosen, peak)
    without = _without_scarcest(planner, chosen, peak)
    cost = sum(p.cost_per_hour for p in pools)
    per_token, per_output = token_costs(planner.workload, peak, cost)
    within = budget_per_hour is None or cost <= budget_per_hour + 1e-9
    less = without.judged
    return FleetPlan(
        scenario=planner.scenario.name,
        peak_rps=round(peak, 3),
        attainment_target=planner.limits.attainment,
        pools=pools,
        cost_per_hour=round(cost, 4),
        cost_per_million_tokens=per_token,
        cost_per_million_output_tokens=per_output,
        attainment=whole.attainment,
        meets=whole.meets,
        scarcest=without.removed,
        attainment_without_one_scarcest=less.attainment if less else None,
        budget_per_hour=budget_per_hour,
        within_budget=within,
        by_model=whole.by_model,
        budget_fleet=None if within else _budget_fleet(planner, pools, budget_per_hour, peak),
        pool_attainment=whole.pools,
        misses=whole.misses,
        by_model_and_class=whole.by_model_and_class,
        scarcest_pool=without.pool,
        without_one_scarcest_by_pool=less.pools if less else {},
        misses_without_one_scarcest=less.misses if less else [],
    )


def chosen_mixes(pools: list[PoolPlan], planner: Planner) -> dict[str, dict[GpuOption, int]]:
    """Each pool's planned backends by option."""
    return {
        p.model: {
            o: p.backends[o.label] for o in planner.options_for(p.model) if p.backends.get(o.label)
        }
        for p in pools
    }


def _budget_fleet(
    planner: Planner, pools: list[PoolPlan], budget: float | None, peak: float
) -> BudgetFleet | None:
    """The budget shared among the pools as their cheapest plans share the cost; each pool
    the mix with the most estimated capacity in its share; the fleet run at the peak. None
    when a pool's share buys no backend."""
    assert budget is not None
    total = sum(p.cost_per_hour for p in pools)
    chosen: dict[str, dict[GpuOption, int]] = {}
    for pool in pools:
        search = planner.searches[pool.model]
        mix = search.best_within(budget * pool.cost_per_hour / total)
        if mix is None:
            return None
        chosen[pool.model] = {o: n for o, n in zip(search.options, mix, strict=True) if n}
    report = planner.simulator(planner.fleet(chosen), peak).run(POLICY)
    return BudgetFleet(
        backends={m: {o.label: n for o, n in mix.items()} for m, mix in chosen.items()},
        cost_per_hour=round(
            sum(o.price_per_hour * n for m in chosen.values() for o, n in m.items()), 4
        ),
        attainment=report.slo_attainment,
    )


@dataclass(slots=True)
class WithoutOne:
    removed: str | None  # the option label of the backend taken away
    pool: str | None  # the model whose pool lost it
    judged: Judged | None  # the fleet run without it (None: nothing to remove)


def _without_scarcest(
    planner: Planner, chosen: dict[str, dict[GpuOption, int]], peak: float
) -> WithoutOne:
    """The whole fleet at the peak with one backend less of the type it has fewest of, from
    the pool with most of them; each pool judged again."""
    totals: dict[GpuOption, int] = {}
    for mix in chosen.values():
        for option, n in mix.items():
            totals[option] = totals.get(option, 0) + n
    if not totals:
        return WithoutOne(None, None, None)
    scarce = min(totals, key=lambda o: (totals[o], -o.price_per_hour, o.label))
    pool = max((m for m in chosen if chosen[m].get(scarce)), key=lambda m: chosen[m][scarce])
    fewer = {m: dict(mix) for m, mix in chosen.items()}
    fewer[pool][scarce] -= 1
    return WithoutOne(scarce.label, pool, planner.judge(fewer, peak))


def gpu_groups(pools: dict[str, dict[GpuOption, int]], catalog: GpuCatalog) -> list[GpuGroup]:
    """The [[gpus]] of a fleet: each model's pool, a group per GPU type in it (its type
    checked against the scenario's catalog: built-ins and its [[gpu_types]])."""
    context = {GPUS_CONTEXT: catalog}
    return [
        GpuGroup.model_validate(
            {"type": o.gpu, "count": n, "model": model, "tensor_parallel": o.tp}, context=context
        )
        for model, mix in pools.items()
        for o, n in mix.items()
        if n > 0
    ]
