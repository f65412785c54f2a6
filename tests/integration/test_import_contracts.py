"""The import-linter contracts hold, and they catch a wrong import (a check that cannot fail
would keep nothing)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import components
from support.paths import REPO

LINT = Path(sys.executable).with_name("lint-imports")
ROUTER_LAYERS = "The router's packages point down"


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {"LINT_IMPORTS": str(LINT), "PATH": "/usr/bin:/bin"}
    script = root / "scripts" / "lint-imports.sh"
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)


@pytest.fixture
def tree(tmp_path) -> Path:
    if not LINT.exists():
        components.missing("lint-imports is not installed: pip install -e '.[dev]'")
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns(".venv", ".git", "build", "__pycache__", "out", "tests")
    shutil.copytree(REPO, root, ignore=ignore)
    return root


def test_contracts_hold(tree) -> None:
    done = lint(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("router/http/proxy.py", "import gpuroute.sim.simulator", "Layers point down"),
        ("gpuroute/prompt.py", "import gpuroute.router.core.scheduler", "Layers point down"),
        ("router/core/breaker.py", "import asyncio", "Sans-IO cores"),
        ("router/core/ledger.py", "import gpuroute.router.observe.metrics", "Cores import nothing"),
        ("sim/run.py", "import gpuroute.planner.plan", "Layers point down"),
        ("gpuroute/console/tables.py", "import gpuroute.router.cli", "Layers point down"),
        ("router/config/router.py", "import gpuroute.router.front.stages", ROUTER_LAYERS),
        ("router/api/table.py", "import gpuroute.router.shared.quotas", ROUTER_LAYERS),
        ("router/attempts/forward.py", "import gpuroute.router.http.proxy", ROUTER_LAYERS),
    ],
)
def test_a_wrong_import_breaks_a_contract(tree, module, line, contract) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    done = lint(tree)
    assert done.returncode != 0
    assert f"{contract}" in done.stdout and "BROKEN" in done.stdout
