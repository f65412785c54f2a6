"""Summarise `gpuroute capacity` JSON files: per-scenario table and geometric means."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def main(folder: str) -> int:
    rows = {}
    for path in sorted(Path(folder).glob("*.json")):
        rows[path.stem] = {r["policy"]: r for r in json.loads(path.read_text())}
    if not rows:
        print(f"no capacity results in {folder}", file=sys.stderr)
        return 1
    head = (
        "scenario                 LC cap  LOW cap  default  def/LC  def/LOW  gp1.2x/gp  gp1.5x/gp"
    )
    print(head)
    ratios_lc = []
    for name, by_policy in rows.items():
        lc, low, dflt = (
            by_policy[p] for p in ("least_connections", "least_outstanding_work", "default")
        )
        d, c, w = (x["slo_capacity_utilization"] for x in (dflt, lc, low))
        base = dflt["goodput_at_capacity_rps"] or float("nan")
        r12 = dflt["goodput_at_1_2x_rps"] / base
        r15 = dflt["goodput_at_1_5x_rps"] / base
        ratios_lc.append(d / c if c > 0 else float("inf"))
        print(
            f"{name:24s} {c:6.3f}  {w:7.3f}  {d:7.3f}  {d / c if c else float('inf'):6.2f}  "
            f"{d / w if w else float('inf'):7.2f}  {r12:9.2f}  {r15:9.2f}"
        )
    finite = [r for r in ratios_lc if math.isfinite(r) and r > 0]
    geo = math.exp(sum(math.log(r) for r in finite) / len(finite))
    print(f"geometric mean default / least_connections SLO capacity: {geo:.3f} over {len(finite)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "out/capacity"))
