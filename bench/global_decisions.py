"""`gpuroute bench global`: how long one global routing decision takes.

20 regions spread over the world (4 jurisdictions), clients placed at random, a quarter of
requests with a residency rule, a third of the regions spilling, one region down. Each
decision is timed alone (perf_counter_ns); the baseline is the `nearest` policy timed in the
same run on the same requests."""

from __future__ import annotations

import random
import time

import numpy as np
from gpuroute.global_.core.geo import Point
from gpuroute.global_.core.policy import GlobalPolicy, GlobalRequest, RegionView
from gpuroute.global_.core.residency import ANY, Allowed
from gpuroute.global_.core.spillover import Spillover

from gpuroute.stats import percentile

JURISDICTIONS = ("us", "eu", "jp", "in")


def world(n_regions: int, rng: random.Random) -> tuple[list[RegionView], Spillover]:
    spill = Spillover()
    views = []
    for i in range(n_regions):
        name = f"region-{i:02d}"
        lat, lon = rng.uniform(-40, 60), rng.uniform(-180, 180)
        views.append(
            RegionView(
                name, JURISDICTIONS[i % 4], Point(lat, lon), up=i != 3,
                queue_delay_s=rng.uniform(0, 0.5),
            )
        )  # fmt: skip
        spill.update(name, 0.95 if i % 3 == 0 else 0.5)
    return views, spill


def requests(n: int, rng: random.Random) -> list[GlobalRequest]:
    out = []
    for _ in range(n):
        rule = rng.random() < 0.25
        allowed = (
            Allowed(frozenset({rng.choice(JURISDICTIONS)}), ("tenant",)) if rule else Allowed(ANY)
        )
        out.append(GlobalRequest("m", allowed, Point(rng.uniform(-50, 70), rng.uniform(-180, 180))))
    return out


def time_decisions(policy: GlobalPolicy, views, reqs, rng: random.Random) -> np.ndarray:
    decide, clock = policy.decide, time.perf_counter_ns
    samples = np.empty(len(reqs), dtype=np.int64)
    for i, req in enumerate(reqs):
        t0 = clock()
        decide(req, views, rng)
        samples[i] = clock() - t0
    return samples / 1000.0  # µs


def timing_row(us: np.ndarray) -> dict[str, float]:
    """Percentiles and mean of per-decision times in µs, as the decision benches report."""
    return {
        "p50_us": percentile(us, 50),
        "p99_us": percentile(us, 99),
        "p999_us": percentile(us, 99.9),
        "mean_us": float(us.mean()),
    }


def run_global_bench(n_regions: int = 20, decisions: int = 100_000, seed: int = 1) -> dict:
    rng = random.Random(seed)
    views, spill = world(n_regions, rng)
    reqs = requests(decisions, rng)
    rows = []
    for mode in ("nearest", "ours"):
        policy = GlobalPolicy(mode, spill)
        time_decisions(policy, views, reqs[: min(2000, decisions)], rng)  # warm-up
        us = time_decisions(policy, views, reqs, rng)
        rows.append({"policy": mode, "decisions": decisions} | timing_row(us))
    base = rows[0]["p99_us"]
    for row in rows:
        row["p99_vs_nearest"] = row["p99_us"] / base
    return {"regions": n_regions, "rows": rows}
