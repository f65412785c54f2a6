"""The docs hold what the code does: every config key is in docs/configuration.md, every
function docs/decisions.md names is in the file it names, every link between the README
and docs/ reaches a file and a heading that exist, and the README's router config is one."""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest
from gpuroute.agent.config import AgentConfig
from gpuroute.global_.config import GlobalConfig
from gpuroute.router.api.table import limits_row, route_limits
from gpuroute.router.config.router import RouterConfig, load_router_config
from gpuroute.router.core.policies import POLICIES
from gpuroute.sim.scenario import Scenario
from pydantic import BaseModel
from support.paths import REPO

from gpuroute.openai_api import API_ROUTES
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


def policy_setting_keys() -> set[str]:
    """`policy_settings.<policy>.<setting>` for every setting of every registered policy."""
    return {
        f"policy_settings.{name}.{field.name}"
        for name, policy in POLICIES.items()
        for field in dataclasses.fields(policy.Settings)
    }


def test_every_policy_setting_is_documented() -> None:
    """A policy's settings are config keys too (`[policy_settings.<name>]`)."""
    missing = sorted(policy_setting_keys() - documented_keys("## Router"))
    assert not missing, f"docs/configuration.md, ## Router: document {missing}"


def test_documented_keys_exist() -> None:
    """A key the docs name but no model has is a renamed or removed key."""
    for section, model in SECTIONS.items():
        known = set(config_keys(model)) | policy_setting_keys()
        known |= {a for key in known for a in ancestors(key)}
        unknown = sorted(documented_keys(section) - known)
        assert not unknown, f"docs/configuration.md, {section}: no such key {unknown}"


# -- links ---------------------------------------------------------------------------------
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens, repeats
    numbered."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_reach_a_file_and_a_heading(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: broken links {broken}"


# -- decisions.md ------------------------------------------------------------------------------
DECISIONS = REPO / "docs" / "decisions.md"
NAME = re.compile(r"^[A-Za-z_][\w.]*$")


def defined(path: Path) -> set[str]:
    """`name` and `Class.name` for every function and class a module defines."""
    names: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(prefix + child.name)
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return names


def where_cells() -> list[str]:
    """The "where" column of every table in docs/decisions.md."""
    cells, column = [], None
    for line in DECISIONS.read_text().splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells_here = [c.strip() for c in line.strip("|").split("|")]
        if column is None:
            column = cells_here.index("where") if "where" in cells_here else -1
        elif column >= 0 and not set(line) <= set("|-: "):
            cells.append(cells_here[column])
    return cells


def test_decisions_name_functions_that_exist() -> None:
    cells = where_cells()
    assert len(cells) > 50  # every table was read
    missing = []
    for cell in cells:
        module: Path | None = None
        for token in BACKTICKED.findall(cell):
            if token.endswith(".py"):
                module = REPO / token
                assert module.exists(), f"docs/decisions.md: no file {token}"
            elif NAME.match(token):
                assert module is not None, f"docs/decisions.md: {token} before any file"
                if token not in defined(module):
                    missing.append(f"{module.relative_to(REPO)}: {token}")
    assert not missing, f"docs/decisions.md names functions that do not exist: {missing}"


# -- the README's config -------------------------------------------------------------------------
def test_the_readmes_router_config_validates(tmp_path: Path) -> None:
    """The config under "Put it in front of your own vLLM servers" is a router config."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    path = tmp_path / "my-router.toml"
    path.write_text(blocks[0])
    config = load_router_config(path)
    assert {b.gpu for b in config.backends} == {"H100", "A100", "L4"}
    assert [k.slo_class for k in config.auth.keys] == ["interactive", "batch"]


def test_the_limits_table_lists_every_route_as_the_code_applies_it() -> None:
    """docs/security.md's "Limits on every route" is router/api/table.py's `route_limits()`
    row for row (tests/security/test_route_limits.py checks each cell live): a route added
    to the code, or a limit changed, cannot leave the table behind."""
    text = (REPO / "docs" / "security.md").read_text()
    section = text.split("## Limits on every route\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    documented = table[2:]  # below the header and its rule
    assert documented == [limits_row(row) for row in route_limits()]
    served = {row.path for row in route_limits()}
    assert set(API_ROUTES) <= served and "/v1/models" in served
