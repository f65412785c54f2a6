"""The simulator's days and scaling pools (sim/daily.py, sim/scaling.py): the rate follows
the shape, a pool grows into a busy spell and drains out after it without losing a
request, and it costs fewer GPU-hours than the fleet it may grow to."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gpuroute.sim.daily import DailySection, change_clock
from gpuroute.sim.scenario import LoadedScenario, Scenario
from gpuroute.sim.simulator import FleetSimulator
from pydantic import ValidationError

# quiet for the first half of a 600 s day, four times busier for the second
STEP = [0.25] * 12 + [1.0] * 12


def step_day(**autoscale) -> LoadedScenario:
    scenario = Scenario.model_validate(
        {
            "name": "step",
            "seed": 5,
            "workload": {
                "profile": "chat",
                "rate_rps": 40.0,
                "daily": {"hourly": STEP, "day_s": 600},
            },
            "gpus": [{"type": "A100", "count": 10}],
            "slo": {"ttft_s": 3.0, "tpot_s": 0.15},
            "router": {"policies": ["default"]},
            "autoscale": {
                "enabled": True,
                "interval_s": 5,
                "boot_s": 20,
                "model_load_s": 10,
                "scale_down_after_s": 30,
                "seasonal": {"enabled": False},
            }
            | autoscale,
        }
    )
    return LoadedScenario(scenario, base_dir=None, source="test")  # type: ignore[arg-type]


def test_arrivals_follow_the_daily_shape_and_its_crowds() -> None:
    daily = DailySection(
        hourly=STEP, day_s=2400, crowds=[{"at_s": 2000, "duration_s": 100, "factor": 4}]
    )
    rng = np.random.default_rng(1)
    peak_time = np.cumsum(rng.exponential(1 / 50.0, 200_000))  # 50 req/s at the peak
    arrivals = change_clock(peak_time, daily)
    assert arrivals[-1] <= daily.span_s
    quiet = ((arrivals >= 100) & (arrivals < 1100)).sum() / 1000
    busy = ((arrivals >= 1300) & (arrivals < 1900)).sum() / 600
    crowd = ((arrivals >= 2010) & (arrivals < 2090)).sum() / 80
    assert quiet == pytest.approx(12.5, rel=0.05)
    assert busy == pytest.approx(50.0, rel=0.05)
    assert crowd == pytest.approx(200.0, rel=0.05)
    assert len(arrivals) == pytest.approx(daily.expected_requests(50.0), rel=0.02)


def test_a_day_needs_a_known_shape() -> None:
    with pytest.raises(ValidationError, match="unknown 'weekend'"):
        DailySection(shape="weekend")
    with pytest.raises(ValidationError, match="at least one above 0"):
        DailySection(hourly=[0.0] * 24)


def test_a_pool_grows_into_the_busy_half_and_drains_out_without_losing_a_request() -> None:
    report, run = FleetSimulator(step_day(standby_backends=1)).replay("default")
    assert run.scaling is not None
    active = [a for _, _, a, _ in run.scaling.timeline]
    times = [t for t, _, _, _ in run.scaling.timeline]
    quiet_size = max(a for t, a in zip(times, active, strict=True) if t < 250)
    busy_size = max(a for t, a in zip(times, active, strict=True) if 350 < t < 600)
    assert busy_size >= 2 * quiet_size  # four times the rate
    assert report.failed == 0 and report.streams_lost == 0
    assert report.completed + report.rejected == report.requests
    assert report.slo_attainment > 0.9
    fixed = 10 * report.sim_duration_s / 3600  # every engine for the whole run
    assert report.fleet["gpu_hours"] < 0.9 * fixed
    # the same scenario, the same seed: the same result
    again, _ = FleetSimulator(step_day(standby_backends=1)).replay("default")
    assert again.to_dict() | {"sim_wall_s": 0} == report.to_dict() | {"sim_wall_s": 0}


def test_scale_in_drains_before_power_off() -> None:
    """The busy half runs into the end of the day: as arrivals stop, the pool shrinks
    while streams are still running, and none of them is cut."""
    report, run = FleetSimulator(step_day(standby_backends=0)).replay("default")
    assert run.scaling is not None and run.scaling.drained_busy > 0  # streams were on them
    assert report.failed == 0 and report.streams_lost == 0 and report.retries == 0


def test_gpuroute_scaling_compares_the_pools_with_fixed_fleets(tmp_path, capsys) -> None:
    from gpuroute.sim.scaling_report import run_scaling

    out = tmp_path / "rows.json"
    assert run_scaling(step_day(standby_backends=1), [10, 5], "default", str(out)) == 0
    rows = json.loads(out.read_text())
    assert [r["fleet"] for r in rows] == [
        "fixed (10)", "fixed (5)", "scaling, 1 standby", "scaling, no standby"
    ]  # fmt: skip
    assert rows[0]["gpu_hours_vs_fixed"] == 1.0
    assert rows[1]["gpu_hours_vs_fixed"] == pytest.approx(0.5, rel=0.05)
    assert rows[3]["gpu_hours"] < rows[2]["gpu_hours"] < rows[0]["gpu_hours"]
    assert all(r["failed"] == 0 for r in rows)
    assert "scaling pools against a fixed fleet" in capsys.readouterr().out


def test_gpuroute_scaling_needs_pools_that_scale() -> None:
    from gpuroute.sim.scaling_report import run_scaling

    from gpuroute.config import ConfigError

    with pytest.raises(ConfigError, match=r"test: \[autoscale\] enabled = true is needed"):
        run_scaling(step_day(enabled=False), [10], "default", None)
    with pytest.raises(ConfigError, match="--fixed must be at least 1"):
        run_scaling(step_day(), [0], "default", None)
