"""`gpuroute sim`: run a scenario under each policy, print a table, optionally write JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuroute.router.core.policies import POLICIES
from gpuroute.sim.report import TABLE_COLUMNS, PolicyReport
from gpuroute.sim.scenario import builtin_scenario, load_scenario
from gpuroute.sim.simulator import FleetSimulator
from gpuroute.sim.traces import TraceError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuroute.config import ConfigError, known_name


def render_table(title: str, reports: list[PolicyReport]) -> Table:
    table = Table(title=title, title_justify="left")
    for _, header, _ in TABLE_COLUMNS:
        table.add_column(header, justify="left" if header == "policy" else "right")
    for report in reports:
        row = report.to_dict()
        table.add_row(*(fmt.format(row[key]) for key, _, fmt in TABLE_COLUMNS))
    return table


def run_sim(
    scenario_path: str | None, policies: list[str] | None, json_out: str | None, *, quiet: bool
) -> int:
    err = Console(stderr=True)
    loaded = load_scenario(scenario_path) if scenario_path else builtin_scenario()
    names = policies or loaded.scenario.router.policies
    try:
        for name in names:
            known_name(name, POLICIES, "policy")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        simulator = FleetSimulator(loaded)
    except TraceError as exc:
        raise ConfigError(f"{loaded.source}: workload.trace: {exc}") from None
    scenario = loaded.scenario
    if not quiet:
        err.print(
            f"[bold]{scenario.name}[/]: {len(simulator.workload):,} requests at "
            f"{simulator.rate_rps:.1f} req/s over {scenario.gpu_count} GPUs "
            f"({', '.join(f'{g.count}×{g.type}' for g in scenario.gpus)})"
        )
    reports = []
    with Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=quiet,
        transient=True,
    ) as progress:
        for name in names:
            task = progress.add_task(name, total=len(simulator.workload))
            reports.append(
                simulator.run(name, lambda done, t=task: progress.update(t, completed=done))
            )
    if not quiet:
        Console(width=None if sys.stdout.isatty() else 160).print(
            render_table(f"{scenario.name} (seed {scenario.seed})", reports)
        )
    if json_out:
        text = json.dumps([r.to_dict() for r in reports], indent=2)
        if json_out == "-":
            sys.stdout.write(text + "\n")
        else:
            Path(json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(json_out).write_text(text + "\n")
    return 0
