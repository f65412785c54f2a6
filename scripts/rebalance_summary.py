"""Summarise scripts/rebalance-matrix.sh: each scenario's SLO capacity with rebalancing off
and on, their ratio and geometric mean, and (a run of the copy at the original's capacity)
the streams moved and the prompt tokens and GPU work their prefill again cost."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from gpuroute.sim.scenario import load_scenario
from gpuroute.sim.simulator import FleetSimulator


def capacity(path: Path) -> float:
    return json.loads(path.read_text())[0]["slo_capacity_utilization"]


def main(folder: str) -> int:
    out = Path(folder)
    names = sorted(p.name.removesuffix("-off.json") for p in out.glob("*-off.json"))
    print("scenario                 cap off  cap on  on/off  moved  reprefill tokens / work")
    ratios = []
    for name in names:
        off, on = capacity(out / f"{name}-off.json"), capacity(out / f"{name}-on.json")
        ratios.append(on / off)
        run = FleetSimulator(load_scenario(out / f"{name}-on.toml")).at_utilization(off)
        report = run.run("default")
        print(
            f"{name:24} {off:7.3f} {on:7.3f} {on / off:7.3f} {report.streams_moved:6d}  "
            f"{report.reprefill_share:.2%} / {report.reprefill_work_share:.2%}"
        )
    if ratios:
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"geometric mean on/off: {mean:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "out/rebalance"))
