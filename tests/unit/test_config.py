from __future__ import annotations

import json
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


def gpu_pool(gpu: str, models: list[str], extra: str = "", count: int = 8) -> str:
    return (
        f'[[regions.gpu_pools]]\ngpu = "{gpu}"\ncount = {count}\n'
        f"models = {json.dumps(models)}\n{extra}"
    )


SCALES = "min_hosts = 2\nmax_hosts = 8\n"
ONE_MODEL = (
    "a pool that scales (min_hosts, max_hosts or standby_hosts) serves exactly one model, "
    "the pool of the routers' desired backends it follows; it serves {models}"
)
ONLY_POOL = (
    "a pool that scales is the only pool of its region serving its model, but {other} also "
    "serves {model!r} (each group would follow the routers' desired backends for the "
    "model's whole pool)"
)


def test_pools_that_scale_each_have_their_model_to_themselves(tmp_path) -> None:
    """The routers export desired backends per model (`pool` = the model): a pool that
    scales serves one model that no other pool of its region serves. Fixed pools may share
    models and serve several; the same model in another region is another pool."""
    text = (
        GOOD_REGION
        + gpu_pool("A100", ["big", "chat"])
        + gpu_pool("H100", ["chat"])  # fixed pools share a model
        + gpu_pool("L4", ["small"], SCALES)
        + gpu_pool("T4", ["small"], count=0)  # no hosts, no group
        + gpu_pool("L4", ["code"], "standby_hosts = 1\nmin_hosts = 1\nmax_hosts = 3\n")
        + gpu_pool("V100", ["x", "y"], "min_hosts = 8\nmax_hosts = 8\n")  # bounds, but fixed
        + GOOD_REGION.replace("us-east", "eu-west")
        + gpu_pool("L4", ["chat"], "max_hosts = 16\n")
    )
    fleet = load_fleet(write(tmp_path, text))
    scaling = [(r.name, p.models) for r in fleet.regions for p in r.gpu_pools if p.autoscales]
    assert scaling == [("us-east", ["small"]), ("us-east", ["code"]), ("eu-west", ["chat"])]


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        (gpu_pool("A100", ["big"]) + gpu_pool("L4", ["small", "tiny"], SCALES),
         "regions[0].gpu_pools[1]: " + ONE_MODEL.format(models="['small', 'tiny']")),
        (gpu_pool("L4", ["a", "b"], "max_hosts = 16\n"),
         "regions[0].gpu_pools[0]: " + ONE_MODEL.format(models="['a', 'b']")),
        (gpu_pool("L4", ["a", "b"], "min_hosts = 1\n"),
         "regions[0].gpu_pools[0]: " + ONE_MODEL.format(models="['a', 'b']")),
        (gpu_pool("L4", ["a", "b"], SCALES + "standby_hosts = 2\n"),
         "regions[0].gpu_pools[0]: " + ONE_MODEL.format(models="['a', 'b']")),
        (gpu_pool("A100", ["big", "small"]) + gpu_pool("L4", ["small"], SCALES),
         "regions[0].gpu_pools[1]: "
         + ONLY_POOL.format(other="regions[0].gpu_pools[0]", model="small")),
        (gpu_pool("L4", ["small"], SCALES) + gpu_pool("A100", ["small"]),
         "regions[0].gpu_pools[0]: "
         + ONLY_POOL.format(other="regions[0].gpu_pools[1]", model="small")),
        (gpu_pool("L4", ["small"], SCALES) + gpu_pool("T4", ["small"], "max_hosts = 9\n"),
         "regions[0].gpu_pools[0]: "
         + ONLY_POOL.format(other="regions[0].gpu_pools[1]", model="small")),
    ],
)  # fmt: skip
def test_a_pool_that_scales_needs_its_model_to_itself(tmp_path, pools, message) -> None:
    path = write(tmp_path, GOOD_REGION + pools)
    with pytest.raises(ConfigError) as info:
        load_fleet(path)
    assert str(info.value) == f"{path}: {message}"


def test_the_one_pool_rule_names_the_region(tmp_path) -> None:
    text = (
        GOOD_REGION
        + gpu_pool("L4", ["small"], SCALES)
        + GOOD_REGION.replace("us-east", "eu-west")
        + gpu_pool("A100", ["small"])
        + gpu_pool("L4", ["small"], "standby_hosts = 1\nmin_hosts = 1\nmax_hosts = 3\n")
    )
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_fleet(path)
    assert str(info.value) == f"{path}: regions[1].gpu_pools[1]: " + ONLY_POOL.format(
        other="regions[1].gpu_pools[0]", model="small"
    )


def test_invalid_toml_and_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"invalid TOML"):
        load_fleet(write(tmp_path, "[[regions]\nname="))
    with pytest.raises(ConfigError, match=r"nope.toml: file not found"):
        load_fleet(tmp_path / "nope.toml")


def test_check_config_cli(tmp_path, capsys) -> None:
    assert main(["check-config", str(REPO / "regions.example.toml")]) == 0
    assert "3 regions, 4 pools, 44 GPUs in 44 engines, 1 model" in capsys.readouterr().out
    bad = write(tmp_path, GOOD_REGION.replace('"us"', '"U.S."'))
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: regions[0].jurisdiction:" in err and "Traceback" not in err
