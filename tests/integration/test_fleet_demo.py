"""`gpuroute demo` and `gpuroute bench fleet` end to end, small: the commands a user runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from gpuroute.testbed.consul_dev import consul_binary
from gpuroute.testbed.ports import free_port
from support import components


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuroute.cli", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_demo_routes_through_discovered_hosts_and_drains_one() -> None:
    port = free_port()
    result = run("demo", "--seconds", "4", "--port", str(port))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"router on http://127.0.0.1:{port} " in out  # where the user asked
    drained = re.search(r"draining (sim-\d{3}-\w+), the host with the most requests in flight", out)
    assert drained is not None and drained.group(1) in out, out
    assert '"drained": true' in out
    assert ", 0 failed" in out
    membership = "Consul membership" if consul_binary() else "static membership"
    assert membership in out
    # beside each backend's share, the latency predicted and measured for a typical request
    assert "where the requests went, and why (a typical request: 250 prompt tokens" in out
    header = next(line for line in out.splitlines() if "TTFT predicted" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "backend", "GPU", "routed", "share", "TTFT predicted", "TTFT measured",
        "end-to-end predicted", "end-to-end measured",
    ]  # fmt: skip
    rows = out[out.index(header) :].splitlines()
    for host in ("sim-000-h100", "sim-001-a100", "sim-002-l4", "sim-003-l4"):
        cells = next(r for r in rows if f"│ {host}" in r).split("│")[3:-1]
        assert cells[1].strip().endswith("%")
        assert all(c.strip().rstrip(" *").endswith(("ms", " s")) for c in cells[2:]), cells
    assert "At light load the fastest GPU meets the SLO best" in out or "took the most" in out


def test_fleet_bench_reports_staleness_raft_writes_and_outage(tmp_path) -> None:
    components.consul()
    out = tmp_path / "fleet.json"
    result = run("bench", "fleet", "--hosts", "3", "--duration", "3", "--outage", "2",
                 "--workers", "2", "--json", str(out))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["hosts"] == 3 and report["staleness_samples"] > 0
    assert report["requests_failed"] == 0 and report["outage"]["failed"] == 0
    assert report["staleness_p99_s"] >= report["staleness_p50_s"] >= 0
    assert "load staleness" in result.stdout


def test_fleet_bench_without_consul_says_how_to_get_it(monkeypatch, tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuroute.cli", "bench", "fleet", "--hosts", "1"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "GPUROUTE_CONSUL": str(tmp_path / "nope")},
    )  # fmt: skip
    assert result.returncode == 2
    assert "make consul" in result.stderr


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_global_demo_keeps_eu_bound_clients_in_the_eu_through_an_outage(secure: bool) -> None:
    result = run("demo", "--global", "--seconds", "2", *(["--secure"] if secure else []))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [ln for ln in result.stdout.splitlines() if ln.startswith("│")]
    assert len(rows) == 3 and all(ln.rstrip("│ ").endswith("0") for ln in rows)  # violations
    up = next(ln for ln in rows if "3 regions up" in ln)
    assert up.split("│")[3].strip() == "0"  # nothing refused while every region is up
    down = next(ln for ln in rows if "eu-west down" in ln)
    assert "eu-west " not in down.split("│")[2]  # nothing served by eu-west while it is down


def test_replicas_bench_compares_shared_and_independent(tmp_path) -> None:
    components.consul()
    components.redis()
    from gpuroute.bench.live import LiveBenchSpec, load_workload
    from gpuroute.bench.replicas import run_replicas_bench

    spec = LiveBenchSpec(engines=["H100", "L4"], duration_s=4.0, time_scale=1.0, replicas=2,
                         target_utilization=0.5)  # fmt: skip
    report = run_replicas_bench(spec, tmp_path)
    sent = len(load_workload(spec)[0])  # the trace both runs replay, derived here
    assert (report["replicas"], report["engines"]) == (2, ["H100", "L4"])
    independent, shared = report["targets"]
    assert (independent["target"], shared["target"]) == (
        "2 replicas, independent", "2 replicas, shared state",
    )  # fmt: skip
    for row in (independent, shared):
        assert (row["requests"], row["completed"], row["failed"]) == (sent, sent, 0)
        # each run starts its own engines: their counters agree with the clients' count
        assert sum(row["engine_requests"]) == sent
        assert len(row["_e2e"]) == sent
    # only the shared run had a Redis
    assert [(tmp_path / run / "redis.log").exists() for run in ("independent", "shared")] == [
        False, True,
    ]  # fmt: skip
    # the result: independent over shared (not the other way round), from the raw latencies
    ratio = np.percentile(independent["_e2e"], 99) / np.percentile(shared["_e2e"], 99)
    assert report["p99_independent_over_shared"] == pytest.approx(ratio, abs=1e-3)


def test_autoscale_demo_brings_hosts_in_for_a_burst_and_drains_them_after() -> None:
    components.consul()
    result = run("demo", "--autoscale", "--seconds", "10", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in result.stdout.splitlines()
            if ln.startswith("│")]  # fmt: skip
    # time, rate, desired (+ standby), in rotation, standby, hosts running, booting, draining
    assert max(int(r[3]) for r in rows) >= 3 and max(int(r[5]) for r in rows) >= 4
    assert rows[-1][2:] == ["1 + 1", "1", "1", "2", "0", "0"]  # back to the floor
    # the initial host, its standby and two boots; at least the two surplus hosts drained
    # (a rate that wavers in the quiet may boot and stop one more, and the first seconds'
    # rate, before the burst, may have one drained and booted again)
    started, stopped = map(int, re.search(r"hosts started (\d+), drained and stopped (\d+)",
                                          result.stdout).groups())  # fmt: skip
    assert started >= 4 and stopped >= 2
    assert "requests sent, 0 failed" in result.stdout
