"""`gpuroute capacity`: how much traffic a fleet takes at an SLO, per policy.

The SLO capacity is the highest offered load (a fraction of the scenario's nominal capacity,
the saturated throughput of its GPUs on its workload) at which the share of requests meeting
their SLO is at least the target, for the fleet and for each model's requests on their own
(a fleet-wide share would hide a pool that misses behind one that has room); the models
that miss just above it are named as what limits it. It is found by bisection over the
load with the scenario's seed, so the same file gives the same answer. Goodput (requests
per second that met their SLO) is then measured at the capacity and at 1.2x and 1.5x of
it: a policy that degrades gracefully keeps its goodput there instead of collapsing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from gpuroute.router.core.policies import resolve_policy_name
from gpuroute.sim.report import PolicyReport
from gpuroute.sim.simulator import FleetSimulator

from gpuroute.console.tables import pyplot

LOW_LOAD, HIGH_LOAD = 0.05, 1.5
OVERLOADS = (1.2, 1.5)


@dataclass(slots=True)
class CapacityResult:
    policy: str
    slo_capacity_utilization: float
    slo_capacity_rps: float
    goodput_at_capacity_rps: float
    goodput_at_1_2x_rps: float
    goodput_at_1_5x_rps: float
    attainment_at_capacity: float
    nominal_capacity_rps: float
    # every load tried, for the plot: (utilisation, attainment, goodput req/s)
    curve: list[tuple[float, float, float]] = field(default_factory=list)
    # several models: each one's attainment (and what fallbacks served) at the capacity
    by_model_at_capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    # several models: those that missed the target at the lowest load tried above the
    # capacity (empty: the fleet as a whole missed there, or nothing above was tried)
    limited_by: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        if not self.by_model_at_capacity:
            # a single-model fleet's JSON as before
            del out["by_model_at_capacity"], out["limited_by"]
        return out


class CapacitySearch:
    """Runs one scenario at many loads for one policy, remembering every run."""

    ITERATIONS = 8
    # the runs a search makes at most: both ends, the bisection's, the overloads
    MOST_RUNS = 2 + ITERATIONS + len(OVERLOADS)

    def __init__(
        self,
        base: FleetSimulator,
        policy: str,
        attainment: float,
        on_run: Callable[[], object] | None = None,
    ) -> None:
        """`on_run`: called after each load's run (a progress bar's step)."""
        if not 0 < attainment <= 1:
            raise ValueError("attainment target must be in (0, 1]")
        self.base = base
        self.policy, self.target = resolve_policy_name(policy), attainment
        self.label = policy
        self.runs: dict[float, tuple[PolicyReport, float]] = {}
        self.on_run = on_run

    def run(self, utilization: float) -> tuple[PolicyReport, float]:
        """The report at `utilization` and the offered rate in req/s."""
        key = round(utilization, 4)
        if key not in self.runs:
            simulator = self.base.at_utilization(key)
            self.runs[key] = (simulator.run(self.policy), simulator.rate_rps)
            if self.on_run is not None:
                self.on_run()
        return self.runs[key]

    def meets(self, utilization: float) -> bool:
        report = self.run(utilization)[0]
        return report.slo_attainment >= self.target and not self.missing(report)

    def missing(self, report: PolicyReport) -> list[str]:
        """The models whose own requests met their SLO less often than the target."""
        return sorted(
            model
            for model, stats in report.by_model.items()
            if not stats.get("attainment", 1.0) >= self.target  # (NaN: none asked: no miss)
            and stats.get("request_share", 0) > 0
        )

    def limited_by(self, capacity: float) -> list[str]:
        """The models missing at the lowest load tried above `capacity`."""
        above = [u for u in self.runs if u > round(capacity, 4)]  # (runs are kept rounded)
        return self.missing(self.runs[min(above)][0]) if above else []

    def capacity(self, iterations: int = ITERATIONS) -> float:
        """Bisection between LOW_LOAD and HIGH_LOAD (0 when even LOW_LOAD misses)."""
        if not self.meets(LOW_LOAD):
            return 0.0
        if self.meets(HIGH_LOAD):
            return HIGH_LOAD
        lo, hi = LOW_LOAD, HIGH_LOAD
        for _ in range(iterations):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.meets(mid) else (lo, mid)
        return lo

    def result(self) -> CapacityResult:
        capacity = self.capacity()
        base = capacity if capacity > 0 else LOW_LOAD
        report, rate = self.run(base)
        overloads = [self.run(base * k)[0].goodput_rps for k in OVERLOADS]
        curve = sorted((u, r.slo_attainment, r.goodput_rps) for u, (r, _) in self.runs.items())
        return CapacityResult(
            policy=self.label,
            slo_capacity_utilization=round(capacity, 4),
            slo_capacity_rps=round(rate if capacity > 0 else 0.0, 3),
            goodput_at_capacity_rps=report.goodput_rps,
            goodput_at_1_2x_rps=overloads[0],
            goodput_at_1_5x_rps=overloads[1],
            attainment_at_capacity=report.slo_attainment,
            nominal_capacity_rps=round(rate / base, 3),
            curve=curve,
            by_model_at_capacity=report.by_model,
            limited_by=self.limited_by(capacity),
        )


def plot_capacity(title: str, results: list[CapacityResult], target: float, out: str) -> None:
    """Attainment against offered load, one line per policy (matplotlib, optional)."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(7, 4))
    for result in results:
        loads = [u for u, _, _ in result.curve]
        axis.plot(loads, [a for _, a, _ in result.curve], marker="o", label=result.policy)
    axis.axhline(target, color="grey", linestyle="--", linewidth=1)
    axis.set_xlabel("offered load (fraction of nominal capacity)")
    axis.set_ylabel("SLO attainment")
    axis.set_ylim(0, 1.02)
    axis.grid(True, alpha=0.3)
    axis.legend(loc="lower left")
    axis.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
