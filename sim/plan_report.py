"""`gpuroute plan`'s work behind its arguments (sim/cli.py): plan, print the fleet, write
JSON and the plot."""

from __future__ import annotations

from dataclasses import asdict

from gpuroute.sim.plan import FleetPlan, PlanLimits, plan_fleet
from gpuroute.sim.plan_check import parse_gpu_options
from gpuroute.sim.run import resolve_scenario, write_json
from gpuroute.sim.scenario import GpuGroup
from gpuroute.sim.traces import TraceError
from rich.console import Console

from gpuroute.config import ConfigError
from gpuroute.reporting import print_table, pyplot, stdout_console

POOL_COLUMNS = (
    ("model", "model", "{}"),
    ("fleet", "backends", "{}"),
    ("peak_rps", "peak req/s", "{:.2f}"),
    ("cost_per_hour", "$/hour", "{:.2f}"),
    ("attainment", "SLO met (pool)", "{:.3f}"),
    ("without_one", "one less", "{}"),
    ("runs", "sim runs", "{}"),
)

# exit status when the plan is over the budget (the fleet is printed all the same)
OVER_BUDGET = 3


def run_plan(
    scenario_path: str | None,
    gpus: list[str] | None,
    *,
    peak_rps: float | None,
    budget: float | None,
    limits: PlanLimits,
    json_out: str | None,
    plot_out: str | None,
    quiet: bool,
) -> int:
    loaded = resolve_scenario(scenario_path)
    if not gpus:  # the types the scenario's fleet has, each once
        gpus = list(dict.fromkeys(_option_spec(g) for g in loaded.scenario.gpus))
    if not 0 < limits.attainment <= 1:
        raise ConfigError("--attainment must be in (0, 1]")
    if (peak_rps is not None and peak_rps <= 0) or (budget is not None and budget <= 0):
        raise ConfigError("--peak-rps and --budget must be positive")
    options = parse_gpu_options(gpus, loaded.scenario)
    if not quiet:
        Console(stderr=True).print(
            f"[bold]{loaded.scenario.name}[/]: planning with {', '.join(o.label for o in options)}"
        )
    try:
        plan = plan_fleet(loaded, options, limits, peak_rps, budget)
    except TraceError as exc:
        raise ConfigError(f"{loaded.source}: workload.trace: {exc}") from None
    if not quiet:
        print_plan(plan)
    if json_out:
        write_json(asdict(plan), json_out)
    if plot_out:
        plot_plan(plan, plot_out)
    return 0 if plan.within_budget else OVER_BUDGET


def _option_spec(group: GpuGroup) -> str:
    return group.type + (f":tp{group.tensor_parallel}" if group.tensor_parallel > 1 else "")


def _backends(counts: dict[str, int]) -> str:
    return " + ".join(f"{n}×{label}" for label, n in counts.items())


def print_plan(plan: FleetPlan) -> None:
    console = stdout_console()
    rows = [
        asdict(p)
        | {
            "fleet": _backends(p.backends),
            "without_one": ", ".join(f"{k} {v:.3f}" for k, v in p.without_one.items()),
        }
        for p in plan.pools
    ]
    print_table(
        console,
        f"{plan.scenario}: cheapest fleet at {plan.peak_rps:g} req/s, "
        f"{plan.attainment_target:.0%} of requests within their SLO",
        rows,
        POOL_COLUMNS,
    )
    for pool in plan.pools:
        for note in pool.notes:
            console.print(f"  {note}")
    verdict = "meets" if plan.meets else "MISSES"
    console.print(
        f"fleet ${plan.cost_per_hour:.2f}/hour, ${plan.cost_per_million_tokens:.3f} per million "
        f"tokens (${plan.cost_per_million_output_tokens:.3f} per million output tokens); "
        f"the whole fleet at the peak: SLO met {plan.attainment:.3f} ({verdict} the target)"
    )
    if plan.scarcest is not None:
        console.print(
            f"with one {plan.scarcest} less: SLO met {plan.attainment_without_one_scarcest:.3f}"
        )
    if not plan.within_budget:
        console.print(
            f"[bold]over budget[/]: ${plan.cost_per_hour:.2f}/hour > "
            f"${plan.budget_per_hour:.2f}/hour; no cheaper fleet of these types meets the SLO"
        )
        best = plan.budget_fleet
        if best is None:
            console.print("the budget buys no backend of some pool")
        else:
            fleet = "; ".join(f"{m}: {_backends(b)}" for m, b in best.backends.items())
            console.print(
                f"the most the budget buys: {fleet} (${best.cost_per_hour:.2f}/hour), "
                f"SLO met {best.attainment:.3f} at the peak"
            )


def plot_plan(plan: FleetPlan, out: str) -> None:
    """Each pool's mixes tried at the peak: SLO attainment against cost, the plan marked."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(7, 4))
    for pool in plan.pools:
        costs = [cost for _, cost, _ in pool.tried]
        points = axis.scatter(costs, [a for _, _, a in pool.tried], label=pool.model)
        axis.scatter(
            [pool.cost_per_hour], [pool.attainment], s=160, facecolors="none",
            edgecolors=points.get_facecolor(), linewidths=2,
        )  # fmt: skip
        for counts, cost, attainment in pool.tried:
            axis.annotate(_backends(counts), (cost, attainment), fontsize=7, xytext=(4, -10),
                          textcoords="offset points")  # fmt: skip
    axis.axhline(plan.attainment_target, color="grey", linestyle="--", linewidth=1)
    axis.set_xlabel("pool cost ($/hour)")
    axis.set_ylabel("pool SLO attainment at its share of the peak")
    axis.set_ylim(0, 1.05)
    axis.grid(True, alpha=0.3)
    axis.legend(loc="lower right")
    axis.set_title(f"{plan.scenario}: mixes tried (circled: the plan)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
