"""`gpuroute plan`'s work behind its arguments (sim/cli.py): plan, print the fleet, write
JSON and the plot."""

from __future__ import annotations

import functools
from dataclasses import asdict

from gpuroute.planner.check import parse_gpu_options
from gpuroute.planner.fleet import WrittenFleet
from gpuroute.planner.fleet import write_fleet as write_plan_fleet
from gpuroute.planner.plan import FleetPlan, PlanLimits, Planner, plan_with
from gpuroute.sim.run import resolve_scenario, write_json
from gpuroute.sim.scenario import GpuGroup
from gpuroute.sim.traces import TraceError
from rich.console import Console

from gpuroute.config import ConfigError
from gpuroute.console.progress import progress_bar
from gpuroute.console.tables import print_table, pyplot, stdout_console

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
    progress: str = "auto",
    write_fleet: str | None = None,
    aws_region: str | None = None,
) -> int:
    loaded = resolve_scenario(scenario_path)
    if not gpus:  # the types the scenario's fleet has, each once
        gpus = list(dict.fromkeys(_option_spec(g) for g in loaded.scenario.gpus))
    if not 0 < limits.attainment <= 1:
        raise ConfigError("--attainment must be in (0, 1]")
    if (peak_rps is not None and peak_rps <= 0) or (budget is not None and budget <= 0):
        raise ConfigError("--peak-rps and --budget must be positive")
    if aws_region is not None and write_fleet is None:
        raise ConfigError("--aws-region goes with --write-fleet")
    options = parse_gpu_options(gpus, loaded.scenario)
    if not quiet:
        Console(stderr=True).print(
            f"[bold]{loaded.scenario.name}[/]: planning with {', '.join(o.label for o in options)}"
        )
    try:
        with progress_bar(quiet=quiet, mode=progress) as shown:  # a step per simulator run
            task = shown.add_task("plan: simulator runs", total=None)
            planner = Planner(loaded, options, limits, functools.partial(shown.advance, task))
            plan = plan_with(planner, peak_rps, budget)
            written = (
                write_plan_fleet(plan, planner, write_fleet, aws_region) if write_fleet else None
            )
    except TraceError as exc:
        raise ConfigError(f"{loaded.source}: workload.trace: {exc}") from None
    if not quiet:
        print_plan(plan)
        if written:
            print_written(written, plan.attainment_target)
    if json_out:
        write_json(asdict(plan) | ({"written_fleet": written.to_dict()} if written else {}),
                   json_out)  # fmt: skip
    if plot_out:
        plot_plan(plan, plot_out)
    return 0 if plan.within_budget else OVER_BUDGET


def print_written(written: WrittenFleet, target: float) -> None:
    """The fleet as written (whole hosts), run at the peak."""
    console = stdout_console()
    pools = "; ".join(
        f"{p.name}: {p.gpus} {p.option.gpu} ({p.engines} engine{'s' if p.engines > 1 else ''}"
        + (f" on {p.hosts} {p.instance.name}" if p.instance else "")
        + (f", {p.engines - p.planned} more than planned" if p.engines > p.planned else "")
        + ")"
        for p in written.pools
    )
    judged = written.judged
    per_pool = ", ".join(f"{m} {a:.3f}" for m, a in judged.pools.items())
    verdict = "every pool meets" if judged.meets else f"{', '.join(judged.misses)} MISS"
    console.print(
        f"fleet file {written.path}: {pools}; ${written.cost_per_hour:.2f}/hour; at the peak "
        f"SLO met {judged.attainment:.3f}, per pool {per_pool} ({verdict} the {target:.0%} "
        "target)"
    )


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
    print_pools(console, plan)
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


CLASS_COLUMNS = (
    ("model", "model", "{}"),
    ("slo_class", "SLO class", "{}"),
    ("ttft_s", "TTFT ≤ s", "{:g}"),
    ("tpot_s", "TPOT ≤ s", "{:g}"),
    ("request_share", "share of model", "{:.2f}"),
    ("attainment", "SLO met", "{:.3f}"),
)


def print_pools(console, plan: FleetPlan) -> None:
    """The whole fleet at the peak, each pool judged on its own; then with one backend of
    the scarcest type less, naming the pool that lost it and any pool that then misses."""
    target = f"the {plan.attainment_target:.0%} target"
    if len(plan.by_model_and_class) > 1:
        title = "the whole fleet at the peak, per model and SLO class"
        print_table(console, title, plan.by_model_and_class, CLASS_COLUMNS)
    pools = ", ".join(f"{m} {a:.3f}" for m, a in plan.pool_attainment.items())
    verdict = f"every pool meets {target}" if plan.meets else _misses(plan.misses, target)
    console.print(
        f"fleet ${plan.cost_per_hour:.2f}/hour, ${plan.cost_per_million_tokens:.3f} per million "
        f"tokens (${plan.cost_per_million_output_tokens:.3f} per million output tokens); "
        f"the whole fleet at the peak: SLO met {plan.attainment:.3f}; per pool: {pools} "
        f"({verdict})"
    )
    if plan.scarcest is None or plan.scarcest_pool is None:
        return
    alone = next(p for p in plan.pools if p.model == plan.scarcest_pool)
    lost = alone.without_one.get(plan.scarcest, 0.0)
    in_fleet = plan.without_one_scarcest_by_pool.get(plan.scarcest_pool, 0.0)
    others = [m for m in plan.misses_without_one_scarcest if m != plan.scarcest_pool]
    said = "MISSES" if lost < plan.attainment_target else "still meets"
    line = (
        f"with one {plan.scarcest} less in the {plan.scarcest_pool} pool: that pool alone "
        f"{lost:.3f} ({said} {target}), {in_fleet:.3f} in the whole fleet"
    )
    if others:
        line += "; " + _misses(others, target)
    whole = plan.attainment_without_one_scarcest
    console.print(line + (f"; the whole fleet {whole:.3f}" if whole is not None else ""))


def _misses(models: list[str], target: str) -> str:
    if len(models) == 1:
        return f"the {models[0]} pool MISSES {target}"
    return f"the {', '.join(models)} pools MISS {target}"


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
