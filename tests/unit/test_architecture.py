"""The house rules a reviewer would otherwise keep by memory: small functions, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO, package_roots

PACKAGE_FOLDERS = tuple(package_roots())  # the source folders pyproject.toml installs
# Declarative tables: one metric definition after another.
TABLES = {("router/observe/metrics.py", "__init__")}
# Modules are sized by what they hold (a reviewer judges; docs/architecture.md), functions
# by this rule.
MAX_FUNCTION_LINES = 60


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


# each tier's one metrics module: every metric it shows, one definition after another
METRICS_MODULES = {"router/observe/metrics.py", "agent/metrics.py", "global/metrics.py"}


DEFINES_METRICS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


def test_each_tier_defines_its_metrics_in_its_metrics_module() -> None:
    """Issue 44 item 7: a metric's name, labels and help are written in one place per tier,
    so none is named twice or found only by reading the module that counts it."""
    elsewhere = []
    for name, text in sources():
        if name.split("/")[0] not in ("router", "agent", "global") or name in METRICS_MODULES:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus"):
                found = [
                    a.name
                    for a in node.names
                    if a.name in DEFINES_METRICS or a.name.endswith("MetricFamily")
                ]
                elsewhere += [f"{name}:{node.lineno} {f}" for f in found]
    assert not elsewhere, elsewhere


PERCENTILE_CALLS = {"percentile", "quantile", "nanpercentile", "nanquantile", "quantiles"}


def test_one_percentile_definition() -> None:
    """Every percentile is gpuroute/stats.py's (issue 44 item 7): no other module asks
    numpy or `statistics` for one, so no figure can drift to another definition."""
    others = []
    for name, text in sources():
        if name == "gpuroute/stats.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            numpy = isinstance(owner, ast.Name) and owner.id in ("np", "numpy")
            attr = node.func.attr
            if attr in PERCENTILE_CALLS or (numpy and attr == "median"):
                others.append(f"{name}:{node.lineno} {attr}")
    assert not others, others


# A run's results, one row per request number, written once when the request ends: output,
# not state a request in flight holds.
RESULT_TABLES = {"sim/simulator.py"}
KEYED_CALLS = {"get", "pop", "setdefault", "add", "discard", "remove", "__contains__"}


def request_id_keys(function: ast.AST) -> set[str]:
    """Names a function binds to a request id (`key = info.request_id`)."""
    names = {"request_id"}
    for node in ast.walk(function):
        is_alias = isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
        if is_alias and node.value.attr == "request_id":
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def keyed_by_request_id(function: ast.AST) -> list[int]:
    """Lines where `function` indexes, looks up or tests membership of a container by a
    request id: per-request state kept outside its lifetime."""
    names = request_id_keys(function)

    def is_id(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "request_id") or (
            isinstance(node, ast.Name) and node.id in names
        )

    lines = []
    for node in ast.walk(function):
        keyed = (
            (isinstance(node, ast.Subscript) and is_id(node.slice))
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in KEYED_CALLS
                and node.args
                and is_id(node.args[0])
            )
            or (
                isinstance(node, ast.Compare)
                and is_id(node.left)
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            )
        )
        if keyed:
            lines.append(node.lineno)
    return lines


def test_only_the_lifetime_registry_keys_state_by_request_id() -> None:
    """Issue 31: a request's state hangs off its RequestLifetime, so one close releases it
    all. A table keyed by request id anywhere else is state a missed release leaves behind
    (the six tables this replaced each leaked on some ending)."""
    found = []
    for name, text in sources():
        if not name.startswith(("router/", "sim/", "global/")):
            continue
        if name == "router/core/lifetime.py" or name in RESULT_TABLES:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [f"{name}:{line} {node.name}" for line in keyed_by_request_id(node)]
    assert not sorted(set(found)), sorted(set(found))


def test_the_request_id_rule_catches_a_table_and_its_aliases() -> None:
    """The rule above on the shapes the old tables had (so it is not vacuous)."""
    shapes = [
        "def f(self, info):\n    self._holding[info.request_id] = info.tenant\n",
        "def f(self, info):\n    key = info.request_id\n    self._waiters[key] = 1\n",
        "def f(self, life):\n    return self._needed.pop(life.request_id, None)\n",
        "def f(self, request_id):\n    return request_id in self._refused\n",
    ]
    for shape in shapes:
        assert keyed_by_request_id(ast.parse(shape).body[0]), shape
    clean = "def f(self, life):\n    self.log(life.request_id)\n    life.tenant = None\n"
    assert not keyed_by_request_id(ast.parse(clean).body[0])


def package_folders(root: Path) -> set[str]:
    """Every folder of the source tree under `root` that is a package (holds `__init__.py`)."""
    return {
        f"{init.parent.relative_to(root).as_posix()}/"
        for folder in PACKAGE_FOLDERS
        for init in (root / folder).rglob("__init__.py")
    }


def mapped_packages(text: str) -> set[str]:
    """The folders an architecture document's layout table (`text`) has a row for."""
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return {
        line.split("`")[1]
        for line in layout.splitlines()
        if line.startswith("| `") and line.split("`")[1].endswith("/")
    }


ARCHITECTURE = REPO / "docs" / "architecture.md"


def test_the_architecture_map_has_a_row_for_every_package_and_no_other() -> None:
    """The map in docs/architecture.md cannot drift from the tree: a package added, moved or
    removed without its row fails here."""
    assert mapped_packages(ARCHITECTURE.read_text()) == package_folders(REPO)


def copied_package_tree(root: Path) -> Path:
    """The repository's package folders, each with an empty `__init__.py`, under `root`."""
    for folder in package_folders(REPO):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").touch()
    return root


def test_the_map_check_catches_a_row_without_a_package_and_a_package_without_a_row(
    tmp_path,
) -> None:
    """Both directions on doctored input: the map less its `router/attempts/` row, and a
    tree with one package more; each undoctored copy still agrees, so the doctoring alone
    makes the comparison fail."""
    text, folders = ARCHITECTURE.read_text(), package_folders(REPO)
    assert "router/attempts/" in mapped_packages(text)
    assert "router/" in folders and "tests/" not in folders
    row = next(line for line in text.splitlines() if line.startswith("| `router/attempts/` |"))
    without_row = text.replace(row + "\n", "", 1)
    assert without_row != text
    assert mapped_packages(without_row) != folders
    assert mapped_packages(without_row) == folders - {"router/attempts/"}

    tree = copied_package_tree(tmp_path)
    assert mapped_packages(text) == package_folders(tree)
    (tree / "router" / "unmapped").mkdir()
    (tree / "router" / "unmapped" / "__init__.py").touch()
    assert mapped_packages(text) != package_folders(tree)
    assert package_folders(tree) - mapped_packages(text) == {"router/unmapped/"}


def test_the_continuer_gives_verdicts_and_never_calls_back_into_the_forwarder() -> None:
    """One attempt runner (router/attempts/forward.py) places, sends and relays the first
    answer and every continuation; the continuer only decides, so it does not name the
    forwarder. (That it imports nothing of it, not even for a type, test_import_graph
    checks: forward imports stream_continuer, so an import back is a mutual pair.)"""
    text = (REPO / "router/attempts/stream_continuer.py").read_text()
    assert "Forwarder" not in text
