"""Where the repository and ../shared/data are, how a test skips without the data, and the
package folders pyproject.toml declares (the one list every tree-walking test reads)."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or skip the test with a message when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"{path} not present (../shared/data is only on the project's machines)")
    return path


@functools.cache
def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def declared_packages() -> tuple[set[str], dict[str, str]]:
    """pyproject.toml's [tool.setuptools] `packages` (import names), and its `package-dir`
    (import name -> folder)."""
    setuptools = _setuptools()
    return set(setuptools["packages"]), dict(setuptools["package-dir"])


def package_roots() -> dict[str, str]:
    """Each top-level source folder -> the import name it installs as (package-dir)."""
    _, package_dir = declared_packages()
    return {folder: name for name, folder in package_dir.items()}
