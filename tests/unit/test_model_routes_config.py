"""The router's [[models]] table from a file: a usable one builds its routes; each mistake
is a ConfigError naming the file and the key (gpuroute/config.py's `file: key: message`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpuroute.router.config.models import model_routes
from gpuroute.router.config.router import load_router_config

from gpuroute.config import ConfigError
from gpuroute.models import MODELS

BACKENDS = """admin_on_public_listener = true
[[backends]]
url = "http://127.0.0.1:9"
gpu = "H100"
models = ["m@v1", "m@v2", "light"]
"""


def load(tmp_path: Path, models: str, backends: str = BACKENDS):
    path = tmp_path / "router.toml"
    path.write_text(backends + models)
    return path, load_router_config(path)


def test_a_table_without_shapes_loads_and_routes(tmp_path: Path) -> None:
    """Shape keys are optional in a router's [[models]]: a built-in of the name, else
    `model_shape`, for each name and its split's versions."""
    _, config = load(tmp_path, (
        '[[models]]\nname = "m"\naliases = ["chat"]\nsplit = {"m@v1" = 95, "m@v2" = 5}\n'
        'fallback = ["lite"]\nslo_class = "interactive"\n'
        '[[models]]\nname = "light"\naliases = ["lite"]\nshape = "llama-3.2-3b"\n'
    ))  # fmt: skip
    routes = model_routes(config.models)
    assert routes.aliases == {"chat": "m", "lite": "light"}
    assert routes.routes["m"].split == (("m@v1", 95.0), ("m@v2", 5.0))
    assert routes.resolve("chat", "s").chain[1:] == ("light",)
    shapes = config.shapes()
    assert shapes["m"] == shapes["m@v1"] == shapes["m@v2"] == MODELS["llama-3.1-8b"]
    assert shapes["light"].layers == MODELS["llama-3.2-3b"].layers


BAD = [
    pytest.param(
        '[[models]]\nname = "a"\naliases = ["b"]\n[[models]]\nname = "b"\naliases = ["a"]\n',
        "models[0].aliases[0]",
        "alias loop: b → a → b",
        id="alias-loop",
    ),
    pytest.param(
        '[[models]]\nname = "m"\nsplit = {"m@v1" = 90, "m@v2" = 5}\n',
        "models[0].split",
        "split weights add up to 95, not 100",
        id="split-sum",
    ),
    pytest.param(
        '[[models]]\nname = "m"\nsplit = {"m@v1" = 110, "m@v2" = -10}\n',
        "models[0].split",
        "split weights must be >= 0",
        id="split-negative",
    ),
    pytest.param(
        '[[models]]\nname = "m"\nsplit = {"m@v1" = 90, "m@v3" = 10}\n',
        "models[0].split",
        "version 'm@v3' is served by no backend",
        id="split-unserved",
    ),
    pytest.param(
        '[[models]]\nname = "m"\nsplit = {"m@v1" = 100}\nfallback = ["nope"]\n',
        "models[0].fallback[0]",
        "unknown model 'nope'",
        id="fallback-unknown",
    ),
    pytest.param(
        '[[models]]\nname = "m"\nsplit = {"m@v1" = 100}\nfallback = ["ghost"]\n'
        '[[models]]\nname = "ghost"\n',
        "models[0].fallback[0]",
        "'ghost' is served by no backend",
        id="fallback-unserved",
    ),
    pytest.param(
        '[[models]]\nname = "light"\naliases = ["small"]\nfallback = ["small"]\n',
        "models[0].fallback[0]",
        "a model cannot fall back to itself",
        id="fallback-self",
    ),
    pytest.param(
        '[[models]]\nname = "m"\n[[models]]\nname = "light"\naliases = ["m"]\n',
        "models[1].aliases[0]",
        "'m' is a model's own name",
        id="alias-is-a-model",
    ),
    pytest.param(
        '[[models]]\nname = "m"\naliases = ["m@v2"]\n',
        "models[0].aliases[0]",
        "'m@v2' is a model's own name",
        id="alias-is-served",
    ),
    pytest.param(
        '[[models]]\nname = "m"\naliases = ["x"]\n[[models]]\nname = "light"\naliases = ["x"]\n',
        "models[1].aliases[0]",
        "'x' is an alias of 'm' already",
        id="alias-twice",
    ),
    pytest.param(
        '[[models]]\nname = "m"\n[[models]]\nname = "m"\n',
        "models[1].name",
        "'m' is listed twice",
        id="name-twice",
    ),
    pytest.param(
        '[[models]]\nname = "m"\nslo_class = "gold"\n',
        "models[0].slo_class",
        "'gold' is no [[slo.classes]]",
        id="slo-class",
    ),
    pytest.param(
        '[[models]]\nname = "m"\nshape = "llama-9"\n',
        "models[0]",
        "unknown model shape 'llama-9'",
        id="shape",
    ),
]


@pytest.mark.parametrize(("models", "key", "message"), BAD)
def test_each_mistake_names_the_file_and_the_key(
    tmp_path: Path, models: str, key: str, message: str
) -> None:
    path = tmp_path / "router.toml"
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, models)
    # a check across keys is reported under the file's top level, then the key
    expected = rf"^{re.escape(str(path))}: (\(top level\): )?{re.escape(f'{key}: {message}')}"
    assert re.match(expected, str(caught.value)), str(caught.value)


def test_with_discovered_backends_only_the_table_itself_is_checked(tmp_path: Path) -> None:
    """Backends found through Consul are not known when the file is read: versions and
    fallbacks cannot be checked against them yet, loops and sums can."""
    consul = 'admin_on_public_listener = true\n[membership]\nconsul = "http://127.0.0.1:8500"\n'
    table = '[[models]]\nname = "m"\nsplit = {"m@v1" = 95, "m@v9" = 5}\nfallback = ["ghost"]\n'
    _, config = load(tmp_path, table + '[[models]]\nname = "ghost"\n', consul)
    assert model_routes(config.models).resolve("m", "s").fallbacks == ("ghost",)
    with pytest.raises(ConfigError, match=r"models\[0\]\.split: split weights add up to 96"):
        load(tmp_path, '[[models]]\nname = "m"\nsplit = {"m@v1" = 95, "m@v9" = 1}\n', consul)
