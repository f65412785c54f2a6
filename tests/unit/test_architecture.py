"""The house rules a reviewer would otherwise keep by memory: small functions, small modules."""

from __future__ import annotations

import ast

from support.paths import REPO

PACKAGE_FOLDERS = ("gpuroute", "router", "agent", "global", "sim", "testbed", "bench", "demo")
# Declarative tables: one metric definition after another.
TABLES = {("router/metrics.py", "__init__")}
MAX_FUNCTION_LINES, MAX_MODULE_LINES = 60, 400


def sources():
    for folder in PACKAGE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if "_pb2" not in path.name:
                yield path.relative_to(REPO).as_posix(), path.read_text()


def test_no_function_over_60_lines_outside_declarative_tables() -> None:
    long = []
    for name, text in sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and (name, node.name) not in TABLES:
                    long.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_module_over_400_lines() -> None:
    big = [f"{name} ({n})" for name, text in sources() if (n := len(text.splitlines())) > 400]
    assert not big, big


def test_building_the_cli_loads_no_simulator_benchmark_or_testbed_code() -> None:
    """Every router, agent and fake-engine process builds the whole parser at start-up; a
    registration module that imports its package's work (numpy, rich, the simulator) makes
    each of them start slower and bigger."""
    import subprocess
    import sys

    probe = (
        "import sys, gpuroute.cli as cli; cli.build_parser(); "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    loaded = set(done.stdout.split())
    heavy = {"numpy", "rich", "aiohttp", "grpc", "redis"} & loaded
    rooms = ("gpuroute.sim.", "gpuroute.bench.", "gpuroute.testbed.", "gpuroute.demo.")
    work = {m for m in loaded if m.startswith(rooms) and not m.endswith(".cli")}
    assert not heavy and not work, sorted(heavy | work)
