"""Terraform for the deployment tests: the CLI (`scripts/build-terraform.sh`), running it on a
copy of a module, and reading modules' HCL with python-hcl2 for invariant checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import hcl2
import pytest

from support import components
from support.paths import REPO

TF = REPO / "deploy" / "terraform"
# the AWS GPU instance catalog modules/fleet-plan reads (with gpuroute.fleet.instances)
CATALOG = "fleet/aws_gpu_instances.json"


def find_terraform() -> str:
    """`make test` provides it (scripts/build-terraform.sh); a missing one is a failure,
    unless outside `make test` this machine cannot build one either (a skip)."""
    found = subprocess.run(
        [str(REPO / "scripts" / "build-terraform.sh")], capture_output=True, text=True
    )
    if found.returncode != 0:
        if shutil.which("go") is None:
            components.missing(f"no terraform and no Go to build OpenTofu: {found.stderr.strip()}")
        pytest.fail(f"scripts/build-terraform.sh failed: {found.stderr.strip()}")
    return found.stdout.strip().splitlines()[-1]


def tf(binary: str, *args: str, cwd: Path, check: bool | int = True) -> subprocess.CompletedProcess:
    """Run Terraform without the user's CLI config; a failure fails the test (unless not
    `check`) with both streams."""
    env = {**os.environ, "TF_CLI_CONFIG_FILE": "/dev/null", "TF_IN_AUTOMATION": "1"}
    result = subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )
    if check and result.returncode != 0:
        pytest.fail(f"{binary} {' '.join(args)} in {cwd}:\n{result.stdout}\n{result.stderr}")
    return result


def copy_module(src: Path, tmp_path: Path) -> Path:
    """Run Terraform on a copy (init writes .terraform/ and a lock file), keeping relative
    paths to the templates, systemd units and the instance catalog valid."""
    dst = tmp_path / "repo"
    if not dst.exists():
        shutil.copytree(REPO / "deploy", dst / "deploy")
        for name in ("regions.example.toml", "fleet.example.toml", "requirements.lock", CATALOG):
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, dst / name)
    return dst / src.relative_to(REPO)


def plugin_dir() -> Path | None:
    """A directory of provider plugins laid out for `terraform init -plugin-dir`
    (registry.terraform.io/hashicorp/aws/VERSION/linux_amd64/...), as
    scripts/build-aws-provider.sh finds it: $GPUROUTE_TF_PLUGIN_DIR, else the build image's
    /opt/tf-plugins, else its cached build; None where there is none (init then asks the
    registry). Tests never start the (very heavy) build: `make terraform` does, when asked."""
    env = {k: v for k, v in os.environ.items() if k != "GPUROUTE_BUILD_AWS_PROVIDER"}
    found = subprocess.run(
        [str(REPO / "scripts" / "build-aws-provider.sh")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    if found.returncode != 0 or not found.stdout.strip():
        return None
    return Path(found.stdout.strip().splitlines()[-1])


def init_with_providers(binary: str, work: Path) -> str | None:
    """`terraform init` of a module that needs the AWS provider: from plugin_dir() where there
    is one, else from the registry. None when it worked, else why not (the caller skips)."""
    mirror = plugin_dir()
    args = ["init", "-backend=false", "-input=false", "-no-color"]
    if mirror is not None:
        args.append(f"-plugin-dir={mirror}")
    init = tf(binary, *args, cwd=work, check=False)
    if init.returncode == 0:
        return None
    return next(
        (ln.strip() for ln in init.stderr.splitlines() if "registry" in ln or "provider" in ln),
        init.stderr.strip()[-200:],
    )


def apply_offline(binary: str, work: Path, variables: dict) -> dict:
    """Apply a provider-free module with these variables; its outputs."""
    (work / "test.tfvars.json").write_text(json.dumps(variables))
    tf(binary, "init", "-backend=false", "-input=false", cwd=work)
    tf(binary, "apply", "-auto-approve", "-input=false", "-var-file=test.tfvars.json", cwd=work)
    return json.loads(tf(binary, "output", "-json", cwd=work).stdout)


def rendered_templates(
    binary: str, tmp_path: Path, variables: dict | None = None
) -> dict[str, str]:
    """The region module's user-data scripts, rendered offline by tests/templates (with
    these variables: `models`, as gpuroute tfvars writes them)."""
    work = copy_module(TF / "tests" / "templates", tmp_path)
    out = apply_offline(binary, work, variables or {})
    return {name: output["value"] for name, output in out.items()}


def heredocs(script: str) -> dict[str, str]:
    """The files a user-data script writes with `cat > /etc/gpuroute/NAME <<...TOML` (or
    JSON: a model's config.json), by their path under /etc/gpuroute."""
    found = re.findall(r"cat > /etc/gpuroute/(\S+) <<'?(TOML|JSON)'?\n(.*?)\n\2\n", script, re.S)
    return {name: text for name, _, text in found}


def write_heredocs(script: str, folder: Path) -> dict[str, str]:
    """The files a user-data script writes (`heredocs`), written under `folder` as the host
    would have them: the shell fills $PRIVATE_IP and $(hostname) at boot."""
    files = heredocs(script)
    for name, text in files.items():
        text = text.replace("$PRIVATE_IP", "10.0.0.5").replace("$(hostname)", "gpu-1")
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return files


def unquote(value):
    """python-hcl2 keeps HCL's quotes on names and string literals; drop them (and its
    block markers) so the checks read like the source."""
    if isinstance(value, dict):
        return {unquote(k): unquote(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [unquote(v) for v in value]
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def parsed(module: Path) -> dict[str, list]:
    """Every top-level block of a module's .tf files, by kind (resource, variable, ...)."""
    blocks: dict[str, list] = {}
    for path in sorted(module.glob("*.tf")):
        with path.open() as fh:
            for kind, items in unquote(hcl2.load(fh)).items():
                blocks.setdefault(kind, []).extend(items)
    return blocks


def resources(module: Path, kind: str) -> dict[str, dict]:
    """A module's resources of one type, by name."""
    return {
        name: body
        for block in parsed(module).get("resource", [])
        for rtype, named in block.items()
        if rtype == kind
        for name, body in named.items()
    }
