"""Every folder holding __init__.py must be listed in pyproject's packages (a wheel drops an
unlisted one silently), and every listed package must map to such a folder."""

from __future__ import annotations

import tomllib
from pathlib import Path

from support.paths import REPO, declared_packages


def package_folder(name: str, package_dir: dict[str, str]) -> Path:
    """Resolve a dotted package name through package-dir, longest prefix first."""
    for prefix in sorted(package_dir, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "."):
            rest = name[len(prefix) :].lstrip(".").split(".") if name != prefix else []
            return REPO.joinpath(package_dir[prefix], *rest)
    return REPO.joinpath(*name.split("."))


def test_every_package_folder_is_listed() -> None:
    packages, package_dir = declared_packages()
    listed = {package_folder(name, package_dir).resolve() for name in packages}
    roots = {REPO / d for d in package_dir.values()}
    on_disk = {
        init.parent.resolve()
        for root in roots
        for init in root.rglob("__init__.py")
        if ".venv" not in init.parts
    }
    missing = sorted(str(p.relative_to(REPO)) for p in on_disk - listed)
    assert not missing, f"folders with __init__.py missing from pyproject packages: {missing}"


def test_every_listed_package_exists() -> None:
    packages, package_dir = declared_packages()
    absent = [n for n in packages if not (package_folder(n, package_dir) / "__init__.py").exists()]
    assert not absent, f"pyproject lists packages with no __init__.py: {absent}"


def test_installed_subpackages_import() -> None:
    import gpuroute.agent
    import gpuroute.global_
    import gpuroute.router.core.policies
    import gpuroute.sim.simulator

    assert gpuroute.router.core.policies.__file__.startswith(str(REPO / "router"))
    assert gpuroute.global_.__file__.startswith(str(REPO / "global"))
    assert gpuroute.agent.__file__ and gpuroute.sim.simulator.__file__


def test_the_lock_pins_every_dependency_with_hashes() -> None:
    """requirements.lock (uv pip compile --generate-hashes) is what the Dockerfile and the
    deploy install with --require-hashes: each runtime dependency is pinned there."""
    import re

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    lock = (REPO / "requirements.lock").read_text()
    pinned = dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\$", lock, re.M))
    for requirement in data["project"]["dependencies"]:
        name = re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pinned, f"{name} is not in requirements.lock (re-run uv pip compile)"
    blocks = re.split(r"^(?=[a-z0-9])", lock, flags=re.M)[1:]
    assert all("--hash=sha256:" in block for block in blocks)


def test_dockerfile_builds_every_package_and_installs_from_the_lock() -> None:
    text = (REPO / "Dockerfile").read_text()
    _, package_dir = declared_packages()
    for folder in set(package_dir.values()):
        assert f"COPY {folder} {folder}" in text, f"the image build misses {folder}/"
    assert "--require-hashes -r /tmp/requirements.lock" in text and "--no-deps" in text
