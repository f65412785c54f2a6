"""`gpuroute sim`'s work: run a scenario under each policy, print a table, optionally write
JSON (sim/cli.py holds only its arguments, so other commands never import the simulator)."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuroute.global_.core.policy import MODES
from gpuroute.router.core.policies import resolve_policy_name
from gpuroute.sim.report import table_columns
from gpuroute.sim.scenario import (
    LoadedScenario,
    builtin_scenario,
    fleet_scenario,
    load_scenario,
)
from gpuroute.sim.simulator import FleetSimulator
from gpuroute.sim.traces import TraceError
from rich.console import Console

from gpuroute.config import ConfigError, known_name
from gpuroute.console.progress import progress_bar
from gpuroute.console.tables import print_table, stdout_console


def resolve_scenario(
    scenario: str | None, fleet: str | None = None, traffic: Traffic | None = None
) -> LoadedScenario:
    """A path to a scenario file, else the name of one shipped in sim/scenarios; with
    `fleet`, its engines from that fleet file; a fleet file alone takes its traffic from
    `traffic` (the flags)."""
    if fleet is not None and scenario is None:
        return fleet_scenario(fleet, **asdict(traffic or Traffic()))
    if scenario is None:
        loaded = builtin_scenario(fleet=fleet)
    elif Path(scenario).is_file() or scenario.endswith(".toml") or "/" in scenario:
        loaded = load_scenario(scenario, fleet)
    else:
        loaded = builtin_scenario(scenario, fleet)
    if traffic is not None and traffic.rate_rps is not None:
        return at_rate(loaded, traffic.rate_rps)
    return loaded


def at_rate(loaded: LoadedScenario, rate_rps: float) -> LoadedScenario:
    """The scenario at `--rate-rps` instead of its own rate (a profile's, not a trace's)."""
    workload = loaded.scenario.workload
    if workload.profile is None or workload.daily is not None:
        raise ConfigError(
            f"--rate-rps: {loaded.source} replays a trace or a day; it keeps its rate"
        )
    update = {"rate_rps": rate_rps, "target_utilization": None}
    scenario = loaded.scenario.model_copy(update={"workload": workload.model_copy(update=update)})
    return LoadedScenario(scenario, loaded.base_dir, loaded.source)


@dataclass(frozen=True, slots=True)
class Traffic:
    """`sim --fleet`'s traffic without a scenario (sim/fleet_file.py traffic_from_flags)."""

    profile: str = "chat"
    requests: int = 2000
    rate_rps: float | None = None
    seed: int = 0


def check_policies(names: list[str]) -> None:
    try:
        for name in names:
            resolve_policy_name(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


CAPACITY_COLUMNS = (
    ("policy", "policy", "{}"),
    ("slo_capacity_utilization", "SLO capacity (load)", "{:.3f}"),
    ("slo_capacity_rps", "req/s", "{:.2f}"),
    ("goodput_at_capacity_rps", "goodput there", "{:.2f}"),
    ("goodput_at_1_2x_rps", "goodput 1.2x", "{:.2f}"),
    ("goodput_at_1_5x_rps", "goodput 1.5x", "{:.2f}"),
)
LIMITED_BY = ("limited_by", "limited by (model)", "{}")


def run_capacity(
    scenario_path: str | None,
    policies: list[str] | None,
    attainment: float,
    json_out: str | None,
    plot_out: str | None,
    *,
    quiet: bool,
    fleet: str | None = None,
    traffic: Traffic | None = None,
    progress: str = "auto",
) -> int:
    from gpuroute.sim.capacity import CapacitySearch, plot_capacity

    loaded = resolve_scenario(scenario_path, fleet, traffic)
    if loaded.scenario.global_ is not None:
        raise ConfigError(f"{loaded.source}: capacity sizes one region; drop [global]")
    if not 0 < attainment <= 1:
        raise ConfigError("--attainment must be in (0, 1]")
    names = policies or loaded.scenario.router.policies
    check_policies(names)
    try:
        base = FleetSimulator(loaded)
    except TraceError as exc:
        raise ConfigError(f"{loaded.source}: workload.trace: {exc}") from None
    # a bar (or lines) per policy, a step per load tried
    with progress_bar(quiet=quiet, mode=progress) as shown:
        results = []
        for name in names:
            task = shown.add_task(f"capacity {name}", total=CapacitySearch.MOST_RUNS)
            done = functools.partial(shown.advance, task)
            results.append(CapacitySearch(base, name, attainment, on_run=done).result())
    scenario = loaded.scenario
    if not quiet:
        several = any(r.by_model_at_capacity for r in results)  # models: name what limits
        print_table(
            stdout_console(),
            f"{scenario.name}: SLO capacity at {attainment:.0%} attainment "
            f"(nominal {results[0].nominal_capacity_rps:.1f} req/s)",
            [r.to_dict() | {"limited_by": ", ".join(r.limited_by) or "-"} for r in results],
            CAPACITY_COLUMNS + ((LIMITED_BY,) if several else ()),
        )
        print_models([(r.policy, r.by_model_at_capacity) for r in results], "at capacity")
    if json_out:
        write_json([r.to_dict() for r in results], json_out)
    if plot_out:
        plot_capacity(scenario.name, results, attainment, plot_out)
    return 0


def run_sim(
    scenario_path: str | None,
    policies: list[str] | None,
    json_out: str | None,
    *,
    quiet: bool,
    fleet: str | None = None,
    traffic: Traffic | None = None,
    progress: str = "auto",
) -> int:
    err = Console(stderr=True)
    loaded = resolve_scenario(scenario_path, fleet, traffic)
    if loaded.scenario.global_ is not None:
        return run_global_sim(loaded, policies, json_out, quiet=quiet)
    names = policies or loaded.scenario.router.policies
    check_policies(names)
    try:
        simulator = FleetSimulator(loaded)
    except TraceError as exc:
        raise ConfigError(f"{loaded.source}: workload.trace: {exc}") from None
    scenario = loaded.scenario
    if not quiet:
        err.print(
            f"[bold]{scenario.name}[/]: {len(simulator.workload):,} requests at "
            f"{simulator.rate_rps:.1f} req/s over {scenario.gpu_count} GPUs "
            f"({', '.join(group_label(g, scenario.workload.model) for g in scenario.gpus)})"
        )
    reports = []
    with progress_bar(quiet=quiet, console=err, mode=progress) as shown:
        for name in names:
            task = shown.add_task(name, total=len(simulator.workload))
            reports.append(
                simulator.run(name, lambda done, t=task: shown.update(t, completed=done))
            )
    rows = [r.to_dict() for r in reports]
    if not quiet:
        print_table(
            stdout_console(), f"{scenario.name} (seed {scenario.seed})", rows, table_columns(rows)
        )
        print_models([(r.policy, r.by_model) for r in reports])
    if json_out:
        write_json(rows, json_out)
    return 0


def group_label(group, default_model: str) -> str:
    """`2×H200-tp4/llama-3.1-70b`: a [[gpus]] group's engines and what they run."""
    return f"{group.count}×{group.kind(default_model).key(default_model)}"


def print_models(by_policy: list[tuple[str, dict[str, dict]]], when: str = "") -> None:
    """With several models: each policy's attainment per requested model, and how many of
    its requests a fallback model served."""
    rows = [
        {"policy": policy, "model": model, **stats}
        for policy, by_model in by_policy
        for model, stats in by_model.items()
    ]
    if rows:
        columns = (
            ("policy", "policy", "{}"),
            ("model", "model", "{}"),
            ("request_share", "share", "{:.2f}"),
            ("attainment", "SLO met", "{:.3f}"),
            ("served_by_fallback", "by fallback", "{:,}"),
            ("refused", "refused", "{:,}"),
        )
        print_table(stdout_console(), f"per model {when}".strip(), rows, columns)


def write_json(data, json_out: str) -> None:
    text = json.dumps(data, indent=2)
    if json_out == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(text + "\n")


GLOBAL_COLUMNS = (
    ("policy", "policy", "{}"),
    ("completed", "done", "{:,}"),
    ("failed", "fail", "{:,}"),
    ("e2e_p99_steady_s", "E2E p99 steady", "{:.2f}"),
    ("e2e_p99_flash_s", "E2E p99 flash", "{:.2f}"),
    ("flash_vs_steady", "flash/steady", "{:.2f}"),
    ("e2e_p99_s", "E2E p99 all", "{:.2f}"),
    ("goodput_rps", "goodput", "{:.1f}"),
    ("served_away_from_home", "spilled", "{:,}"),
    ("residency_violations", "residency viol.", "{:,}"),
)


def run_global_sim(loaded, policies: list[str] | None, json_out: str | None, *, quiet: bool) -> int:
    from gpuroute.sim.global_sim import run_global_scenario

    scenario = loaded.scenario
    if policies:
        for name in policies:
            known_name(name, MODES, "global policy")
    if not quiet:
        Console(stderr=True).print(
            f"[bold]{scenario.name}[/]: {len(scenario.global_.regions)} regions, "
            f"{scenario.gpu_count} GPUs; global policies "
            f"{', '.join(policies or scenario.global_.policies)}"
        )
    report = run_global_scenario(loaded, policies)
    if not quiet:
        print_table(
            stdout_console(),
            f"{scenario.name}: {report['rate_rps']} req/s steady "
            f"({report['gpus']} GPUs, capacity {report['capacity_rps']} req/s)",
            report["rows"],
            GLOBAL_COLUMNS,
        )
    if json_out:
        write_json(report, json_out)
    return 0
