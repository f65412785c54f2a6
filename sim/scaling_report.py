"""`gpuroute scaling`: a scenario whose pools scale, against a fixed fleet in the same run.

Runs of the same requests: each fixed fleet (`--fixed N` engines of the scenario's GPU
group: the fleet sized for the peak, e.g. by `gpuroute capacity` or `gpuroute plan`; the
first is the one GPU-hours are compared with), the scaling pools as the scenario has them,
and the same without warm standby. For each: GPU-hours (and
their ratio to the fixed fleet's), cost, SLO attainment, and the most important class's
attainment and TTFT p99, over the day and inside its flash crowds."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import numpy as np
from gpuroute.sim.report import OK, PolicyReport
from gpuroute.sim.scenario import LoadedScenario
from gpuroute.sim.simulator import FleetSimulator, RegionalRun

from gpuroute.config import ConfigError
from gpuroute.console.tables import print_table, stdout_console
from gpuroute.stats import percentile

COLUMNS = (
    ("fleet", "fleet", "{}"),
    ("gpu_hours", "GPU-hours", "{:.2f}"),
    ("gpu_hours_vs_fixed", "vs fixed", "{:.3f}"),
    ("cost_usd", "cost $", "{:.2f}"),
    ("slo_attainment", "SLO met", "{:.4f}"),
    ("top_attainment", "top class met", "{:.4f}"),
    ("top_ttft_p99_s", "top TTFT p99 s", "{:.2f}"),
    ("crowd_top_attainment", "crowd: top met", "{:.4f}"),
    ("crowd_top_ttft_p99_s", "crowd: top p99 s", "{:.2f}"),
    ("rejected", "refused", "{}"),
    ("failed", "failed", "{}"),
)


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    loaded: LoadedScenario


def variants(loaded: LoadedScenario, fixed: list[int]) -> list[Variant]:
    """The fixed fleets, the scenario's scaling pools, and those without standby."""
    scenario = loaded.scenario
    if not scenario.autoscale.enabled:
        raise ConfigError(f"{loaded.source}: [autoscale] enabled = true is needed to compare")
    if len(scenario.gpus) != 1:
        raise ConfigError(f"{loaded.source}: `gpuroute scaling` takes one [[gpus]] group")
    off = scenario.autoscale.model_copy(update={"enabled": False})
    bare = scenario.autoscale.model_copy(update={"standby_backends": 0})

    def copy(**update) -> LoadedScenario:
        return LoadedScenario(scenario.model_copy(update=update), loaded.base_dir, loaded.source)

    standby = scenario.autoscale.standby_backends
    fleets = [
        Variant(
            f"fixed ({n})",
            copy(autoscale=off, gpus=[scenario.gpus[0].model_copy(update={"count": n})]),
        )
        for n in fixed
    ]
    return [
        *fleets,
        Variant(f"scaling, {standby} standby", loaded),
        Variant("scaling, no standby", copy(autoscale=bare)),
    ]


def summary(name: str, report: PolicyReport, run: RegionalRun) -> dict[str, object]:
    """One row: the report's figures plus the top class's inside the flash crowds."""
    top = run.classes[0]
    outcomes = run.outcomes
    arrivals = np.asarray(run.arrivals)
    status = np.asarray(outcomes.status)
    ttft = np.asarray(outcomes.ttft)
    mine = np.asarray(outcomes.slo_class) == 0
    daily = run.scenario.workload.daily
    inside = np.zeros(len(arrivals), dtype=bool)
    for crowd in daily.crowds if daily else ():
        start = arrivals[0] + crowd.at_s
        inside |= (arrivals >= start) & (arrivals < start + crowd.duration_s)
    crowd = mine & inside
    served = crowd & (status == OK)
    met = served & (ttft <= top.ttft_s)  # (its TPOT is in the day's figures)
    top_report = report.by_slo_class[top.name]
    return {
        "fleet": name,
        **report.fleet,
        "slo_attainment": report.slo_attainment,
        "top_class": top.name,
        "top_attainment": top_report["attainment"],
        "top_ttft_p99_s": top_report["ttft_p99_s"],
        "crowd_top_requests": int(crowd.sum()),
        "crowd_top_attainment": float(met.sum() / crowd.sum()) if crowd.any() else None,
        "crowd_top_ttft_p99_s": percentile(ttft[served], 99) if served.any() else None,
        "rejected": report.rejected,
        "failed": report.failed,
        "requests": report.requests,
    }


def run_scaling(loaded: LoadedScenario, fixed: list[int], policy: str, json_out: str | None) -> int:
    """Each fixed fleet, then the scaling pools; GPU-hours against the first fixed fleet."""
    if not fixed or min(fixed) < 1:
        raise ConfigError("--fixed must be at least 1")
    rows = []
    for variant in variants(loaded, fixed):
        report, run = FleetSimulator(variant.loaded).replay(policy)
        rows.append(summary(variant.name, report, run))
    base = rows[0]["gpu_hours"]
    for row in rows:
        row["gpu_hours_vs_fixed"] = row["gpu_hours"] / base if base else None
    title = f"{loaded.scenario.name}: scaling pools against a fixed fleet ({policy})"
    print_table(stdout_console(), title, rows, COLUMNS)
    if json_out:
        text = json.dumps(rows, indent=2)
        if json_out == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(json_out, "w") as out:
                out.write(text + "\n")
    return 0
