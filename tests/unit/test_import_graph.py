"""No module imports its importer, not even under TYPE_CHECKING or inside a function: a
pair of modules that import each other is one module cut in two, or a part that reaches
back into whoever built it (give it a narrow interface instead)."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO, package_roots

PACKAGES = package_roots()  # folder -> import name (pyproject.toml's package-dir)
# Pairs known and still to take apart (issue 44 took the last ones apart). Each must still
# be a pair: the set only shrinks.
PENDING: set[tuple[str, str]] = set()


def module_files(root: Path = REPO) -> dict[str, tuple[Path, bool]]:
    """Every module by its import name: (its file, whether it is a package's __init__)."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join([package, *parts])] = (path, is_package)
    return found


def imported(name: str, tree: ast.AST, is_package: bool, known: set[str]) -> set[str]:
    """The known modules one module imports anywhere in it (top level, TYPE_CHECKING
    blocks, function bodies); `from package import module` counts as the module."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: None if is_package else -1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return (out & known) - {name}


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {
        name: imported(name, ast.parse(path.read_text()), is_package, known)
        for name, (path, is_package) in files.items()
    }


def mutual_pairs(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (a, b) if a < b else (b, a)
        for a, targets in graph.items()
        for b in targets
        if a in graph.get(b, ())
    }


def test_no_module_imports_its_importer() -> None:
    pairs = mutual_pairs(import_graph())
    assert sorted(pairs - PENDING) == []
    assert sorted(PENDING - pairs) == [], "taken apart: drop them from PENDING"


def test_an_import_under_type_checking_or_in_a_function_counts() -> None:
    """The graph sees what a plain import scan would miss."""
    known = {"p.a", "p.b", "p.c", "p.d"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from p.b import Thing\n"
        "def late():\n    from . import c\n"
        "import p.d as d\n"
    )
    assert imported("p.a", ast.parse(source), False, known) == {"p.b", "p.c", "p.d"}
    assert mutual_pairs({"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}) == {("p.a", "p.b")}
