"""The live benchmark's machinery on a tiny workload: every target serves every request."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gpuroute.bench.live import Fault, LiveBenchSpec, parse_engines, parse_fault, run_target
from gpuroute.bench.targets import BenchError
from gpuroute.bench.wrk import parse_wrk
from gpuroute.sim.workloads import Workload
from gpuroute.testbed.peer_routers import PEER_ROUTERS
from support import components


def tiny_workload(n: int = 40, rate: float = 20.0) -> Workload:
    rng = np.random.default_rng(0)
    return Workload(
        np.arange(n) / rate,
        rng.integers(50, 400, n),
        rng.integers(5, 40, n),
        [],
        [],
    )


@pytest.mark.parametrize(
    "target",
    ["least_outstanding_work", "haproxy", "nginx", "haproxy-weighted", *PEER_ROUTERS],
)
def test_each_target_serves_the_whole_trace(tmp_path, target) -> None:
    binary = target.split("-")[0]
    if binary in ("haproxy", "nginx"):
        components.binary(binary)
    if target in PEER_ROUTERS:
        components.peer_routers()
    spec = LiveBenchSpec(engines=["H100", "L4"], time_scale=1.0, stream_interval_ms=10)
    result = asyncio.run(run_target(target, spec, tiny_workload(), tmp_path))
    assert (result["requests"], result["completed"], result["failed"]) == (40, 40, 0)
    assert 0 < result["ttft_p50_s"] <= result["e2e_p50_s"] <= result["e2e_p99_s"]
    # only our router says which engine served a request, so only it gets work utilisation
    assert ("gpu_util_cv" in result) == (target == "least_outstanding_work")
    if target == "least_outstanding_work":
        assert result["gpu_util_mean"] > 0


def test_killed_engine_loses_no_unstreamed_request_and_gets_no_new_one(tmp_path) -> None:
    spec = LiveBenchSpec(
        engines=["A100", "A100", "A100"],
        time_scale=5.0,  # requests finish inside the 5 s stall window (see closing note)
        stream=False,
        faults=[Fault("kill", 1, 1.0)],
    )
    result = asyncio.run(
        run_target("least_outstanding_work", spec, tiny_workload(60, 30), tmp_path)
    )
    assert result["failed"] == 0 and result["completed"] == 60
    (kill,) = result["faults"]
    assert kill["first_failure_after_s"] is not None
    assert kill["picks_after_first_failure"] == 0


def test_cli_inputs_are_checked() -> None:
    assert parse_engines("H100:2,L4:1") == ["H100", "H100", "L4"]
    for bad in ("Z900:1", "H100", "H100:0", ""):
        with pytest.raises(BenchError, match="--engines"):
            parse_engines(bad)
    assert parse_fault("slow", "2@30:20") == Fault("slow", 2, 30.0, 20.0)
    with pytest.raises(BenchError, match="ENGINE@SECONDS"):
        parse_fault("kill", "x@y")
    from gpuroute.bench.commands import policy_names

    assert policy_names(None) == ["slo_aware"] == policy_names(["default"])
    with pytest.raises(BenchError, match=r"--policy: unknown policy 'fastest'; known: .*default"):
        policy_names(["least_connections", "fastest"])


def test_wrk_output_is_read() -> None:
    out = """Running 2s test @ http://127.0.0.1:1/v1/completions
  Latency Distribution
     50%  412.00us
     75%  500.00us
     90%    1.20ms
     99%    2.50ms
  1000 requests in 2.00s, 1.00MB read
Requests/sec:    500.25
"""
    assert parse_wrk(out) == pytest.approx(
        {"rps": 500.25, "p50_ms": 0.412, "p99_ms": 2.5, "non_2xx": 0}
    )


@pytest.mark.parametrize("shared", [True, False])
def test_router_replicas_serve_the_whole_trace(tmp_path, shared) -> None:
    if shared:
        components.redis()
    spec = LiveBenchSpec(
        engines=["H100", "L4"], time_scale=1.0, stream_interval_ms=10, replicas=2,
        shared_state=shared,
    )  # fmt: skip
    result = asyncio.run(run_target("least_outstanding_work", spec, tiny_workload(), tmp_path))
    assert (result["requests"], result["completed"], result["failed"]) == (40, 40, 0)
    logs = sorted(p.name for p in (tmp_path / "least_outstanding_work").glob("*.log"))
    assert "replica-1.log" in logs and ("redis.log" in logs) == shared


def test_tenants_bench_run_grants_the_bursty_tenant_its_quota_and_no_more(tmp_path) -> None:
    from gpuroute.bench.tenants import TenantsSpec, one_run, paired_slowdown

    components.redis()
    spec = TenantsSpec(engines=["H100", "L4"], replicas=2, duration_s=2.0, burst_from_s=0.5,
                       burst_to_s=1.5, time_scale=1.0)  # fmt: skip
    steady, bursty = tiny_workload(40, 20), tiny_workload(30, 30)
    row = asyncio.run(one_run("burst, quota", spec, steady, bursty, 6.0, tmp_path))
    assert (row["steady"]["ok"], row["steady"]["failed_other"]) == (40, 0)
    # 6 requests per minute: the minute's allowance at once, and < 1 more refilled in ~1 s
    assert (row["bursty"]["ok"], row["bursty"]["refused_429"]) == (6, 24)
    same = paired_slowdown(row["_steady"], row["_steady"], (0.0, 2.0))
    assert (same["requests"], same["p50"], same["p99"]) == (40, 1.0, 1.0)


def test_paired_slowdown_compares_the_same_request_inside_the_window_only() -> None:
    from gpuroute.bench.loadgen import RequestResult
    from gpuroute.bench.tenants import paired_slowdown

    alone = [RequestResult(i, sent_at=1.0 + i, ok=True, e2e_s=2.0) for i in range(5)]
    other = [RequestResult(i, sent_at=1.0 + i, ok=True, e2e_s=2.0 * (i + 1)) for i in range(5)]
    other[1].ok = False  # failed in the other run: no pair
    # window [1, 4.5): requests 0-3; request 1 has no pair; ratios 1, 3, 4
    assert paired_slowdown(alone, other, (1.0, 4.5)) == {
        "requests": 3, "p50": 3.0, "p90": 3.8, "p99": 3.98,
    }  # fmt: skip
    assert paired_slowdown(alone, other, (10.0, 20.0)) == {"requests": 0}


def test_tenants_bench_inputs_are_checked() -> None:
    import argparse

    from gpuroute.bench.commands import tenants_spec

    good = dict(burst="20:40", duration=60.0, replicas=4, time_scale=2.0,
                steady_utilization=0.5, burst_utilization=1.0, quota_share=0.02,
                router_queue=False)  # fmt: skip
    assert tenants_spec(argparse.Namespace(**good), ["H100"]).burst_to_s == 40.0
    for change, message in (
        ({"burst": "20"}, "FROM:TO"),
        ({"burst": "50:70"}, "FROM < TO <= --duration"),
        ({"quota_share": 0.0}, "--quota-share"),
    ):
        with pytest.raises(BenchError, match=message):
            tenants_spec(argparse.Namespace(**(good | change)), ["H100"])


def test_stream_bench_relays_every_paced_token_through_each_proxy() -> None:
    from gpuroute.bench.stream import run_stream_bench

    components.binary("haproxy")
    report = run_stream_bench(["gpuroute", "haproxy"], [1, 8], tokens=5, interval_ms=20, rounds=1)
    rows = {(r["target"], r["streams"]): r for r in report["rows"]}
    assert set(rows) == {(t, n) for t in ("direct", "gpuroute", "haproxy") for n in (1, 8)}
    for row in rows.values():
        assert (row["completed"], row["failed"]) == (row["streams"], 0)
        assert row["events"] == row["streams"] * 6  # five tokens, one finish event each
        assert 15 < row["itl_p50_ms"] < 200  # paced: one token every 20 ms
        # a proxy's memory is read from its process tree; direct has none to read
        assert (row["kib_per_stream"] is None) == (row["target"] == "direct")
