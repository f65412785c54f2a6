"""The simulator-against-live comparison and the decision-time benchmark's bookkeeping
(their numbers are benchmarks, never asserted here)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from gpuroute.bench.agreement import compare, live_scenario, simulate
from gpuroute.bench.decisions import build, requests, run_decide_bench, time_decisions
from gpuroute.sim.report import offered_window_s
from gpuroute.sim.workloads import synthetic


def test_offered_window_counts_each_request_one_interarrival() -> None:
    assert offered_window_s(np.array([0.0, 1.0, 2.0, 3.0])) == pytest.approx(4.0)
    assert offered_window_s(np.array([5.0])) == 1.0  # one request: its rate is itself


def test_fleet_keeps_engine_order_in_runs_of_one_type() -> None:
    scenario = live_scenario(["H100", "H100", "L4", "H100"], 2.0, 0.1).scenario
    assert [(g.type, g.count) for g in scenario.gpus] == [("H100", 2), ("L4", 1), ("H100", 1)]
    assert scenario.slo.ttft_s == 2.0


def live_row(attainment: float, ttft: float, shares: dict[str, float]) -> dict:
    return {"target": "slo_aware", "slo_attainment": attainment, "ttft_p50_s": ttft,
            "gpu_share": shares}  # fmt: skip


def test_agreement_judges_each_bound() -> None:
    sim = {"slo_attainment": 0.90, "ttft_p50_s": 1.0, "gpu_share": {"H100": 0.6, "L4": 0.4}}
    assert compare(live_row(0.94, 1.2, {"H100": 0.64, "L4": 0.36}), sim)["agrees"] == "yes"
    assert compare(live_row(0.96, 1.0, {"H100": 0.6, "L4": 0.4}), sim)["agrees"] == "no"
    assert compare(live_row(0.90, 1.5, {"H100": 0.6, "L4": 0.4}), sim)["agrees"] == "no"
    row = compare(live_row(0.90, 1.0, {"H100": 0.7, "L4": 0.3}), sim)
    assert row["agrees"] == "no" and row["max_share_gap"] == pytest.approx(0.1)


def test_simulating_the_live_fleet_reports_shares_of_every_request() -> None:
    workload = synthetic("chat", 300, 20.0, seed=3)
    result = simulate(["H100", "L4", "L4"], workload, 2.0, "slo_aware", (2.0, 0.1))
    assert sum(result["gpu_share"].values()) == pytest.approx(1.0, abs=0.01)
    assert 0 <= result["slo_attainment"] <= 1 and result["ttft_p50_s"] > 0


def test_the_live_routers_fixed_overhead_is_added_to_simulated_ttft() -> None:
    workload = synthetic("chat", 200, 10.0, seed=4)
    args = (["H100", "L4"], workload, 2.0, "slo_aware", (2.0, 0.1))
    bare, padded = simulate(*args), simulate(*args, {"H100": 0.5, "L4": 0.5})
    assert padded["ttft_p50_s"] == pytest.approx(bare["ttft_p50_s"] + 0.5)
    assert padded["gpu_share"] == bare["gpu_share"]


def test_decide_bench_keeps_the_fleet_busy_and_times_least_connections_first() -> None:
    """Every timed decision books its request, and the bench finishes the oldest so that
    exactly `keep` stay in flight: the latency model and ledger are as full as in a busy
    fleet, not empty."""
    scheduler = build("slo_aware", 30)
    samples = time_decisions(scheduler, requests(500, random.Random(2)), keep=120, seed=2)
    assert len(samples) == 500 and len(scheduler.ledger) == 120
    assert sum(b.in_flight for b in scheduler.backends) == 120
    report = run_decide_bench(n_backends=30, decisions=300, policies=["default"])
    assert [r["policy"] for r in report["rows"]] == ["least_connections", "slo_aware"]
