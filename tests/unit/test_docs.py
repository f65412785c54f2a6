"""The docs hold what the code does: every config key is in docs/configuration.md."""

from __future__ import annotations

import re
import types
import typing

import pytest
from gpuroute.agent.config import AgentConfig
from gpuroute.global_.config import GlobalConfig
from gpuroute.router.config import RouterConfig
from gpuroute.sim.scenario import Scenario
from pydantic import BaseModel
from support.paths import REPO

from gpuroute.regions import FleetConfig

CONFIGURATION = REPO / "docs" / "configuration.md"
# docs/configuration.md's sections and the model each one documents
SECTIONS = {
    "## Router": RouterConfig,
    "## Agent": AgentConfig,
    "## Global tier": GlobalConfig,
    "## Fleet file": FleetConfig,
    "## Scenario file": Scenario,
}
BACKTICKED = re.compile(r"`([^`]+)`")


def _models_in(annotation: object) -> tuple[list[type[BaseModel]], bool]:
    """The config models a field holds, and whether it holds a list of them."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        found: list[type[BaseModel]] = []
        listed = False
        for arg in typing.get_args(annotation):
            models, in_list = _models_in(arg)
            found += models
            listed = listed or in_list
        return found, listed
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin is list:
        return _models_in(typing.get_args(annotation)[0])[0], True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation], False
    return [], False


def config_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every value a TOML file may set for `model` (sections are what their keys are), as
    the docs write them: `auth.keys[].tenant`, `listen.tls.cert_file`."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        models, listed = _models_in(field.annotation)
        if not models:
            keys.append(key)
        for inner in models:
            keys += config_keys(inner, key + ("[]." if listed else "."))
    return keys


def documented_keys(section: str) -> set[str]:
    """The keys in the first column of a section's tables. Shorthands: `.x` is a sibling of
    the key before it (`listen.tls.cert_file`, `.key_file`), `_file` and `_env` the key
    before it with that suffix (`admin_token` (or `_file`, `_env`))."""
    text = CONFIGURATION.read_text()
    start = text.index(section + " ")
    end = text.find("\n## ", start + 1)
    keys: set[str] = set()
    for line in text[start : end if end > 0 else None].splitlines():
        if not line.startswith("| `"):
            continue
        last = ""
        for token in BACKTICKED.findall(line.split(" | ")[0]):
            if token.startswith("_"):
                keys.add(last + token)
                continue
            if token.startswith("."):
                token = last.rpartition(".")[0] + token
            keys.add(token)
            last = token
    return keys


def ancestors(key: str) -> list[str]:
    """`a.b[].c` -> `a`, `a.b`, `a.b[]`, `a.b[].c`: a row for a whole section documents it."""
    cuts = [m.start() for m in re.finditer(r"\.|\[\]", key)]
    return [key[:i] for i in cuts if i] + [key]


@pytest.mark.parametrize("section", SECTIONS)
def test_every_config_key_is_documented(section: str) -> None:
    documented = documented_keys(section)
    missing = [
        key
        for key in config_keys(SECTIONS[section])
        if not any(a in documented for a in ancestors(key))
    ]
    assert not missing, f"docs/configuration.md, {section}: document {missing}"


def test_documented_keys_exist() -> None:
    """A key the docs name but no model has is a renamed or removed key."""
    for section, model in SECTIONS.items():
        known = set(config_keys(model))
        known |= {a for key in known for a in ancestors(key)}
        unknown = sorted(documented_keys(section) - known)
        assert not unknown, f"docs/configuration.md, {section}: no such key {unknown}"
