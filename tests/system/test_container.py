"""The container image: the Dockerfile built with Debian's podman on a base debootstrap made
from Debian's packages (no image registry is reachable here), its contents checked, then each
tier run in it from the container configs of deploy/container/ as shipped (/etc/gpuroute/),
secrets in mounted files: healthy by the image's own healthcheck, probing the tier's own
port, and reachable through published ports.

The first run builds the base (then cached under ~/.cache/gpuroute/container/) and the
dependencies' layer (cached by podman until requirements.lock changes); docs/benchmarks.md
gives the times. Where containers cannot run (no usable OCI runtime),
the image is still built (RUN steps chrooted) and checked, and the tiers' run is skipped
with the exact commands that failed and their errors."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from support.live import MODEL, wait_for
from support.paths import REPO
from support.podman import IMAGE, Podman, build_image, podman_here

pytestmark = pytest.mark.timeout(1200)  # the first run builds the base and the dependencies

TOKEN = "container-admin-token"
PORTS = {"router": 8080, "router-admin": 9090, "global": 8090, "global-admin": 9091,
         "agent-load": 7070, "agent": 7071, "engine": 8000}  # fmt: skip
REGIONS = """\
[[regions]]
name = "us-east"
city = "Washington DC"
jurisdiction = "us"
location = { lat = 38.9, lon = -77.0 }

[[regions]]
name = "eu-west"
city = "Frankfurt"
jurisdiction = "eu"
location = { lat = 50.1, lon = 8.7 }
"""


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    scratch = tmp_path_factory.mktemp("podman")
    found = podman_here(scratch)
    build_image(found, scratch)
    return found


@pytest.fixture(scope="module")
def rootfs(podman: Podman) -> Iterator[Path]:
    """The image's files, mounted read-only on this host (no container needed)."""
    yield Path(podman("image", "mount", IMAGE).stdout.strip())
    podman("image", "unmount", IMAGE, check=False)


def test_image_runs_unprivileged_exposes_every_tier_and_checks_its_health(
    podman: Podman,
) -> None:
    config = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    assert config["Config"]["User"] == "gpuroute"
    assert config["Config"]["Entrypoint"] == ["gpuroute"]
    assert set(config["Config"]["ExposedPorts"]) == {f"{p}/tcp" for p in PORTS.values()}
    assert config["Healthcheck"]["Test"] == ["CMD", "gpuroute-healthcheck"]  # podman: not in Config


def test_image_holds_each_tier_and_the_container_configs(rootfs: Path) -> None:
    """Run chrooted into the image's files: every tier's entry point answers, and the
    configs the image ships are valid as they are (the global tier's once given its regions
    file, which is the fleet's own)."""
    for tier in ("router", "global", "agent", "fake-engine"):
        done = chrooted(rootfs, "gpuroute", tier, "--help")
        assert done.returncode == 0 and f"usage: gpuroute {tier}" in done.stdout, done.stderr
    for tier in ("router", "agent"):
        done = chrooted(rootfs, "gpuroute", "check-config", f"/etc/gpuroute/{tier}.toml")
        assert done.returncode == 0, done.stdout + done.stderr
    assert os.access(rootfs / "usr/local/bin/gpuroute-healthcheck", os.X_OK)


def chrooted(rootfs: Path, *command: str) -> subprocess.CompletedProcess[str]:
    path = "/opt/gpuroute/bin:/usr/bin:/bin"
    return subprocess.run(
        ["chroot", str(rootfs), "env", f"PATH={path}", *command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pod(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Every tier in one pod, as shipped: the router's backend and the agent's engine are
    `engine` (the fake engine beside them), their secrets files under /run/secrets/, every
    port published on 127.0.0.1."""
    if podman.cannot_run is not None:
        pytest.skip(f"containers cannot run here: {podman.cannot_run}")
    files = tmp_path_factory.mktemp("secrets")
    secrets = {"admin-token": TOKEN, "load-stream-token": "load-stream-token"}
    for name, value in secrets.items():
        (files / name).write_text(value)
    (files / "regions.toml").write_text(REGIONS)
    name = f"gpuroute-test-{os.getpid()}"
    publish = [a for p in PORTS.values() for a in ("--publish", f"127.0.0.1::{p}")]
    podman("pod", "create", "--name", name, "--add-host", "engine:127.0.0.1", *publish)
    mounts = [f"--volume={files / s}:/run/secrets/{s}:ro" for s in secrets]
    mounts.append(f"--volume={files / 'regions.toml'}:/etc/gpuroute/regions.toml:ro")
    try:
        podman("run", "--detach", "--pod", name, "--name", f"{name}-engine", IMAGE,
               "fake-engine", "--host", "0.0.0.0", "--model", MODEL)  # fmt: skip
        for tier in ("router", "global", "agent"):
            config = f"/etc/gpuroute/{tier}.toml"
            podman("run", "--detach", "--pod", name, "--name", f"{name}-{tier}", *mounts,
                   IMAGE, tier, "--config", config)  # fmt: skip
        yield name
    finally:
        podman("pod", "rm", "--force", name, check=False)


def published(podman: Podman, pod: str, port: int) -> str:
    """The host's 127.0.0.1:PORT for the pod's container port."""
    return podman("port", f"{pod}-engine", f"{port}/tcp").stdout.strip()


@pytest.mark.parametrize(
    ("tier", "url"),
    [
        ("engine", "http://127.0.0.1:8000/health"),
        ("router", "http://127.0.0.1:8080/healthz"),
        ("global", "http://127.0.0.1:8090/healthz"),
        ("agent", "http://127.0.0.1:7071/healthz"),
    ],
)
def test_each_tier_is_healthy_on_its_own_port(
    podman: Podman, pod: str, tier: str, url: str
) -> None:
    container = f"{pod}-{tier}"

    def healthy() -> bool:
        return podman("healthcheck", "run", container, check=False).returncode == 0

    try:
        wait_for(healthy, timeout=60, what=f"{container}'s healthcheck")
    except AssertionError:
        raise AssertionError(podman("logs", container, check=False).stderr) from None
    state = json.loads(podman("inspect", container).stdout)[0]["State"]
    assert state["Health"]["Status"] == "healthy"
    assert state["Health"]["Log"][-1]["Output"].strip() == f"gpuroute-healthcheck: {url} is up"


def test_tiers_answer_through_their_published_ports(podman: Podman, pod: str) -> None:
    """The configs listen on 0.0.0.0: a request from outside the container is served, and
    the admin listeners, off loopback, ask for the token from the secrets file."""
    for tier in ("router", "global", "agent"):
        name = f"{pod}-{tier}"
        wait_for(lambda n=name: podman("healthcheck", "run", n, check=False).returncode == 0,
                 timeout=60, what=f"{name}'s healthcheck")  # fmt: skip
    router = published(podman, pod, PORTS["router"])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with pytest.raises(urllib.error.HTTPError) as keyless:  # published: keys required
        fetch(f"http://{router}/v1/chat/completions", body)
    assert keyless.value.code == 401
    key = "sk-container-test"
    admin = published(podman, pod, PORTS["router-admin"])
    digest = hashlib.sha256(key.encode()).hexdigest()
    fetch(f"http://{admin}/admin/keys", {"sha256": digest, "tenant": "t"}, token=TOKEN)
    answer = fetch(f"http://{router}/v1/chat/completions", body, token=key)
    assert json.loads(answer)["usage"]["completion_tokens"] == 3
    for admin in ("router-admin", "global-admin"):
        url = f"http://{published(podman, pod, PORTS[admin])}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            fetch(url)
        assert refused.value.code == 401
        assert b"# TYPE" in fetch(url, token=TOKEN)
    agent = f"http://{published(podman, pod, PORTS['agent'])}"
    status = json.loads(fetch(f"{agent}/status"))  # reads are open; acting takes the token
    assert status["engine"]["ok"] and status["engine"]["models"] == [MODEL]
    assert status["gpu"]["source"] == "simulated"  # no NVML in the container: the fake's GPU
    with pytest.raises(urllib.error.HTTPError) as refused:
        fetch(f"{agent}/undrain", body={})
    assert refused.value.code == 401
    health = fetch(f"http://{published(podman, pod, PORTS['global'])}/healthz")
    assert json.loads(health) == {"status": "ok"}


def fetch(url: str, body: dict | None = None, token: str | None = None) -> bytes:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=10) as r:
        return r.read()


def test_healthcheck_fails_without_a_tier_or_a_listener(podman: Podman, pod: str) -> None:
    alone = podman("run", "--rm", "--entrypoint", "gpuroute-healthcheck", IMAGE, check=False)
    assert alone.returncode == 1
    assert "unhealthy: no `gpuroute TIER` process in this container" in alone.stderr
    elsewhere = "http://127.0.0.1:9/healthz"
    down = podman("exec", f"{pod}-router", "gpuroute-healthcheck", elsewhere, check=False)
    assert down.returncode == 1 and elsewhere in down.stderr, down.stderr


def test_base_is_debian_bookworm_with_python_3_11(rootfs: Path) -> None:
    assert "VERSION_CODENAME=bookworm" in (rootfs / "etc/os-release").read_text()
    done = chrooted(rootfs, "python3", "--version")
    assert done.stdout.startswith("Python 3.11"), done.stdout + done.stderr


# -- without podman: the Dockerfile, the configs it ships and its healthcheck ---------------
CONTAINER = REPO / "deploy" / "container"


def test_dockerfile_exposes_and_checks_every_tier() -> None:
    text = (REPO / "Dockerfile").read_text()
    exposed = re.search(r"^EXPOSE (.+)$", text, re.M)
    assert exposed is not None and set(exposed[1].split()) == {str(p) for p in PORTS.values()}
    assert re.search(r'^    CMD \["gpuroute-healthcheck"\]$', text, re.M)
    assert re.search(r"^ARG BASE=\S*python:3\.11-slim-bookworm$", text, re.M)
    usage = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "/etc/gpuroute/router.toml" in usage
    assert "example.toml" not in usage and "127.0.0.1" not in usage


@pytest.mark.parametrize(("tier", "admin"), [("router", "admin_listen"), ("global", "admin_listen"),
                                             ("agent", "admin")])  # fmt: skip
def test_dockerfile_configs_listen_everywhere_and_read_tokens_from_files(
    tier: str, admin: str
) -> None:
    """Off loopback the admin listeners need a token (config refuses them without): the
    configs read it, and the agent's load-stream token, from Podman's or Docker's secrets."""
    config = tomllib.loads((CONTAINER / f"{tier}.toml").read_text())
    listeners = [config[admin]] + [config[k] for k in ("listen", "load_stream") if k in config]
    assert all(listener["host"] == "0.0.0.0" for listener in listeners)
    assert config["admin_token_file"] == "/run/secrets/admin-token"
    if tier == "agent":
        assert config["load_stream"]["token_file"] == "/run/secrets/load-stream-token"


def healthcheck_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthcheck", CONTAINER / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_probes_the_port_each_tier_listens_on(tmp_path: Path) -> None:
    """The tier's config, found relative to the process's working directory, names the port
    (defaults where it does not); TLS makes it https; the fake engine takes flags."""
    check = healthcheck_module()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "r.toml").write_text('[listen]\nhost = "::"\nport = 8443\ntls = {}\n')
    (tmp_path / "cwd" / "g.toml").write_text('regions_file = "x"\n')
    (tmp_path / "cwd" / "a.toml").write_text('[admin]\nhost = "10.1.2.3"\nport = 7171\n')
    assert check.url_of(tmp_path, ["router", "--config", "r.toml"]) == "https://[::1]:8443/healthz"
    assert check.url_of(tmp_path, ["global", "--config=g.toml"]) == "http://127.0.0.1:8090/healthz"
    assert check.url_of(tmp_path, ["agent", "run", "--config", "a.toml"]) == (
        "http://10.1.2.3:7171/healthz"
    )
    engine = ["fake-engine", "--host", "0.0.0.0", "--port", "9000"]
    assert check.url_of(tmp_path, engine) == "http://127.0.0.1:9000/health"
    with pytest.raises(LookupError, match=r"cannot read missing\.toml"):
        check.url_of(tmp_path, ["router", "--config", "missing.toml"])
    with pytest.raises(LookupError, match="gpuroute plan has no listener"):
        check.url_of(tmp_path, ["plan"])
