"""Multi-region simulation: residency never bends, nearest-only does not spill, spillover
absorbs a flash crowd, an outage moves traffic; scenario errors name the key."""

from __future__ import annotations

import pytest
from gpuroute.sim.global_sim import run_global_scenario
from gpuroute.sim.scenario import load_scenario

from gpuroute.config import ConfigError

SCENARIO = """
name = "small-global"
seed = 3
[workload]
profile = "chat"
target_utilization = 0.3
max_requests = 1
[[gpus]]
type = "A100"
count = 12
region = "us"
[[gpus]]
type = "A100"
count = 8
region = "eu"
[[gpus]]
type = "A100"
count = 4
region = "ap"
[global]
duration_s = 60.0
saturation_delay_s = 8.0
[[global.regions]]
name = "us"
jurisdiction = "us"
lat = 38.9
lon = -77.0
[[global.regions]]
name = "eu"
jurisdiction = "eu"
lat = 50.1
lon = 8.7
[[global.regions]]
name = "ap"
jurisdiction = "jp"
lat = 35.7
lon = 139.7
[[global.clients]]
region = "us"
share = 0.5
[[global.clients]]
region = "eu"
share = 0.33
bound = 0.5
[[global.clients]]
region = "ap"
share = 0.17
"""


def scenario(tmp_path, extra: str = ""):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO + extra)
    return load_scenario(path)


FLASH = """
[[global.events]]
kind = "flash_crowd"
region = "ap"
at_s = 20.0
duration_s = 25.0
factor = 8.0
"""


@pytest.mark.slow
def test_flash_crowd_spills_without_residency_violations(tmp_path) -> None:
    report = run_global_scenario(scenario(tmp_path, FLASH))
    rows = {r["policy"]: r for r in report["rows"]}
    assert all(r["residency_violations"] == 0 and r["failed"] == 0 for r in rows.values())
    assert rows["nearest"]["served_away_from_home"] == 0
    assert rows["ours"]["served_away_from_home"] > 0
    assert rows["ours"]["flash_vs_steady"] < rows["nearest"]["flash_vs_steady"]
    assert rows["ours"]["goodput_rps"] > rows["nearest"]["goodput_rps"]
    assert rows["ours"]["requests"] == rows["nearest"]["requests"]  # the same arrivals


def test_outage_moves_traffic_and_bound_clients_are_refused_not_moved(tmp_path) -> None:
    outage = """
[[global.events]]
kind = "outage"
region = "eu"
at_s = 20.0
duration_s = 20.0
"""
    report = run_global_scenario(scenario(tmp_path, outage), ["ours"])
    row = report["rows"][0]
    assert row["residency_violations"] == 0
    assert row["served_away_from_home"] > 0  # unbound EU clients served elsewhere
    assert row["failed"] > 0  # EU-bound clients during the outage: refused, never moved
    assert row["regions"]["eu"]["served"] > 0  # before and after the outage


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('region = "ap"\nshare = 0.17', 'region = "mars"\nshare = 0.17'),
         "clients: unknown region 'mars'"),
        (('count = 4\nregion = "ap"', 'count = 4\nregion = "moon"'), "gpus[2].region 'moon'"),
        (("duration_s = 60.0", 'duration_s = 60.0\npolicies = ["fastest"]'),
         "unknown global policy 'fastest'"),
    ],
)  # fmt: skip
def test_bad_global_scenario_names_file_and_key(tmp_path, change, message) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace(*change))
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert str(path) in str(err.value) and message in str(err.value)
