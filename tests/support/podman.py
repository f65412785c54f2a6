"""Debian's podman for tests/system/test_container.py: the image built from the Dockerfile
on a base debootstrap made from Debian's packages (scripts/build-container-base.sh; no image
registry is reachable from the project's machines), and whether containers can run here at
all, found by trying, with the exact error when they cannot."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from support.components import binary, missing
from support.paths import REPO

BASE = "localhost/gpuroute-base:bookworm"
IMAGE = "localhost/gpuroute:test"
# Where podman's defaults cannot start a container, these can: runc instead of crun (crun
# 1.8 refuses cgroup v1 with controllers also on the v2 hierarchy, "hybrid mode"), and
# rlimits no higher than this process's (podman asks for nofile 1048576 and nproc 32768
# or more, which a process without CAP_SYS_RESOURCE cannot raise its limits to).
FALLBACK_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
"""
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass
class Podman:
    """podman with the environment that lets it run containers here (or, where none can
    run, `cannot_run`: the commands tried and what each said)."""

    path: str
    env: dict[str, str] = field(default_factory=dict)
    cannot_run: str | None = None

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.path, *args], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **self.env},
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
        return done


def podman_here(scratch: Path) -> Podman:
    """podman (a skip, or a failure under `make test`, without it, debootstrap or root),
    with the base image built and the way to run containers found."""
    found = Podman(binary("podman"))
    binary("debootstrap")
    if os.geteuid() != 0:
        missing("the container tests build a base with debootstrap and run podman as root")
    built = subprocess.run(
        [REPO / "scripts" / "build-container-base.sh", BASE],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    tried = []
    conf = scratch / "containers.conf"
    conf.write_text(FALLBACK_CONF)
    for env in ({}, {"CONTAINERS_CONF": str(conf)}):
        found.env = env
        probe = ("run", "--rm", "--publish", "127.0.0.1::8000", BASE, "true")
        done = found(*probe, check=False)
        if done.returncode == 0:
            return found
        shown = " ".join(f"{k}={v}" for k, v in env.items())
        tried.append(
            f"`{shown + ' ' if shown else ''}podman {' '.join(probe)}`: {done.stderr.strip()}"
        )
    found.env, found.cannot_run = {}, "; ".join(tried)
    return found


def build_image(podman: Podman, scratch: Path) -> None:
    """The Dockerfile, as it is, on the debootstrap base. pip in the build trusts this host's
    CA bundle (on the project's machines a proxy re-signs TLS), and without a runtime that can
    start containers, RUN steps run chrooted."""
    pip_conf = scratch / "pip.conf"
    index = os.environ.get("PIP_INDEX_URL")
    pip_conf.write_text(
        f"[global]\ncert = {CA_BUNDLE}\n" + (f"index-url = {index}\n" if index else "")
    )
    args = ["build", "--format", "docker", "--build-arg", f"BASE={BASE}", "--tag", IMAGE]
    args += ["--volume", f"{pip_conf}:/etc/pip.conf:ro"]
    if CA_BUNDLE.exists():
        args += ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    if podman.cannot_run is not None:
        args += ["--isolation", "chroot"]
    podman(*args, str(REPO), timeout=900)
