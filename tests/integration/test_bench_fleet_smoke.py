"""`gpuroute bench live --scenario` on the issue-32 fleet for two seconds of arrivals: eleven
fake engines (a declared A800, 70B at tensor parallel 4, an MoE on MI300X), our router
with the scenario's GPU types and models, three models' requests, all served."""

from __future__ import annotations

import json

from support.paths import REPO

from gpuroute.cli import main

REAL_FLEET = REPO / "sim" / "scenarios" / "real-fleet.toml"


def test_bench_live_runs_a_scenario_fleet_and_reports_each_model(tmp_path, capsys) -> None:
    out = tmp_path / "report.json"
    code = main(
        ["bench", "live", "--scenario", str(REAL_FLEET), "--policies", "slo_aware",
         "--duration", "2", "--time-scale", "1", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    printed = capsys.readouterr().out
    # the scenario's three models rule the baselines out, and the run says so
    assert "haproxy, nginx skipped" in printed and "per model (requested)" in printed
    assert report["engines"].count("A800-tp4/llama-3.1-70b") == 1
    (target,) = report["targets"]
    assert target["target"] == "slo_aware"
    assert target["requests"] == report["requests"] > 50
    assert (target["completed"], target["failed"]) == (target["requests"], 0)
    by_model = target["by_model"]
    assert set(by_model) == {"llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b"}
    assert sum(m["requests"] for m in by_model.values()) == target["requests"]
    # which engine kinds served them (the router says which engine served each)
    shares = target["gpu_share"]
    assert set(shares) <= set(report["engines"]) and abs(sum(shares.values()) - 1) < 0.01
    assert any(kind.endswith("/qwen3-30b-a3b") for kind in shares)
    assert target["slo_attainment"] > 0.5 and target["gpu_util_mean"] > 0
