from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO

from gpuroute.cli import main
from gpuroute.config import ConfigError
from gpuroute.regions import load_fleet


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "regions.toml"
    path.write_text(text)
    return path


def test_example_regions_file_loads() -> None:
    fleet = load_fleet(REPO / "regions.example.toml")
    assert [r.name for r in fleet.regions] == ["us-east", "eu-west", "ap-northeast"]
    assert fleet.region("eu-west").jurisdiction == "eu"
    assert sum(p.count for p in fleet.region("us-east").gpu_pools) == 12


GOOD_REGION = """
[[regions]]
name = "us-east"
jurisdiction = "us"
location = { lat = 38.9, lon = -77.0 }
"""


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        (
            GOOD_REGION + '[[regions.gpu_pools]]\ngpu = "Z900"\ncount = 1\nmodels = ["m"]\n',
            "regions[0].gpu_pools[0].gpu",
            "unknown GPU type 'Z900'",
        ),
        (GOOD_REGION.replace('jurisdiction = "us"\n', ""), "regions[0].jurisdiction", "required"),
        (GOOD_REGION.replace("lat = 38.9", "lat = 138.9"), "regions[0].location.lat", "90"),
        (GOOD_REGION + 'colour = "blue"\n', "regions[0].colour", "unknown key"),
        (GOOD_REGION + GOOD_REGION, "regions", "appears twice"),
        ("regions = []\n", "regions", "at least 1"),
    ],
)
def test_bad_regions_file_names_file_and_key(tmp_path, text, key, fragment) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_fleet(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: ") or f"{path}: {key}:" in message
    assert fragment in message


def test_invalid_toml_and_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"invalid TOML"):
        load_fleet(write(tmp_path, "[[regions]\nname="))
    with pytest.raises(ConfigError, match=r"nope.toml: file not found"):
        load_fleet(tmp_path / "nope.toml")


def test_check_config_cli(tmp_path, capsys) -> None:
    assert main(["check-config", str(REPO / "regions.example.toml")]) == 0
    assert "3 regions, 44 GPUs" in capsys.readouterr().out
    bad = write(tmp_path, GOOD_REGION.replace('"us"', '"U.S."'))
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: regions[0].jurisdiction:" in err and "Traceback" not in err
