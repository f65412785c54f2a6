"""The fleet file through Terraform (docs/deploy.md): `gpuroute tfvars` of the example fleet
packed by modules/fleet-plan as gpuroute packs it (the shared instance catalog), Terraform's
own refusals naming the pool, the GPU hosts' access to their pools' tokens (python-hcl2:
no provider here), the fleet's [[models]] reaching the routers, and user data that fits
EC2's 16 KB."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from gpuroute.fleet.checks import load_deploy_fleet
from gpuroute.fleet.instances import instance_for, load_catalog
from gpuroute.fleet.tfvars import fleet_tfvars
from gpuroute.router.config.router import load_router_config
from support.paths import REPO
from support.terraform import (
    TF,
    apply_offline,
    copy_module,
    parsed,
    rendered_templates,
    resources,
    tf,
    write_heredocs,
)

FLEET = REPO / "fleet.example.toml"
PLAN = TF / "modules" / "fleet-plan"
REGION = TF / "modules" / "region"
pytestmark = pytest.mark.timeout(600)


def test_terraform_packs_the_example_fleet_as_gpuroute_does(terraform, tmp_path) -> None:
    """Left to choose (no instance_type, no gpus_per_host), fleet-plan picks for every pool of
    the example the instance gpuroute picks, and packs it the same: engines per host, hosts.
    The 70B's p5e hosts run two TP4 engines each, on GPUs 0-3 and 4-7, ports 8000 and 8001."""
    fleet = load_deploy_fleet(FLEET)
    regions = fleet_tfvars(fleet, FLEET)["regions"]
    catalog_gpus = {i.gpu for i in load_catalog()}
    for region in regions.values():
        for pool in region["gpu_pools"]:
            if pool["gpu"] in catalog_gpus:  # not the declared type: Terraform chooses
                del pool["instance_type"], pool["gpus_per_host"]
    groups = apply_offline(terraform, copy_module(PLAN, tmp_path), {"regions": regions})
    groups = groups["gpu_node_groups"]["value"]
    expected = {}
    for ref in fleet.pools():
        pool = ref.pool
        if pool.gpu in catalog_gpus:
            pool = pool.model_copy(update={"instance_type": None})
        instance = instance_for(fleet, pool)
        per_host = instance.gpus // pool.gpus_per_engine
        hosts = -(-pool.count // instance.gpus)
        expected[f"{ref.region.name}/{ref.name}"] = (instance.name, instance.gpus, per_host, hosts)
    assert {k: (g["instance_type"], g["gpus_per_host"], g["engines_per_host"], g["hosts"])
            for k, g in groups.items()} == expected  # fmt: skip
    h200 = groups["us-east/llama70b-h200"]
    assert (h200["instance_type"], h200["engines_per_host"], h200["hosts"]) == (
        "p5e.48xlarge", 2, 2,
    )  # fmt: skip
    packed = [(e["gpu_indices"], e["port"], e["load_stream_port"]) for e in h200["engines"]]
    assert packed == [([0, 1, 2, 3], 8000, 7070), ([4, 5, 6, 7], 8001, 7072)]
    assert h200["engine"]["args"][:2] == ["--model", "meta-llama/Llama-3.1-70B-Instruct"]


def test_terraform_names_the_pool_it_refuses(terraform, tmp_path) -> None:
    """A pool gpuroute tfvars would refuse, written by hand: Terraform stops at plan with a
    message that names the region and pool, for each of the three ways to get it wrong."""
    pools = [
        {"name": "odd-tp", "gpu": "H200", "count": 6, "models": ["m"], "tensor_parallel": 3,
         "instance_type": "p5e.48xlarge"},
        {"gpu": "L4", "count": 1, "models": ["m"], "instance_type": "g9.xlarge"},
        {"name": "wrong-gpu", "gpu": "L4", "count": 8, "models": ["m"],
         "instance_type": "p5e.48xlarge"},
        {"gpu": "MI300X", "count": 8, "models": ["m"]},
    ]  # fmt: skip
    region = {"aws_region": "us-east-1", "cidr_index": 0, "jurisdiction": "us",
              "azs": ["us-east-1a", "us-east-1b", "us-east-1c"], "neighbours": [],
              "gpu_pools": pools}  # fmt: skip
    work = copy_module(PLAN, tmp_path)
    (work / "bad.tfvars.json").write_text(json.dumps({"regions": {"us-east": region}}))
    tf(terraform, "init", "-backend=false", "-input=false", cwd=work)
    plan = tf(terraform, "plan", "-no-color", "-input=false", "-var-file=bad.tfvars.json",
              cwd=work, check=False)  # fmt: skip
    assert plan.returncode != 0
    errors = " ".join(plan.stderr.replace("│", " ").split())  # Terraform wraps its messages
    assert (
        "us-east/odd-tp: tensor_parallel x pipeline_parallel = 3 does not divide the 8 GPUs "
        "of p5e.48xlarge" in errors
    )
    assert "us-east/l4-1: instance type g9.xlarge is not in fleet/aws_gpu_instances.json" in errors
    assert "us-east/wrong-gpu: p5e.48xlarge carries H200 GPUs, not L4" in errors
    assert "us-east/mi300x-3: no instance in fleet/aws_gpu_instances.json carries MI300X" in errors


def _gpu_statements() -> list[dict]:
    doc = next(
        b["aws_iam_policy_document"]["host"]
        for b in parsed(REGION)["data"]
        if "host" in b.get("aws_iam_policy_document", {})
    )
    return [
        {**d["statement"]["content"][0], "for_each": d["statement"]["for_each"]}
        for d in doc.get("dynamic", [])
        if 'each.key == "gpu"' in d["statement"]["for_each"]
    ]


def test_gpu_hosts_read_exactly_the_tokens_their_pools_name() -> None:
    """GetSecretValue and GetParameter on the ARNs of the tokens the region's pools name, on
    GPU hosts only; never on every secret."""
    by_action = {tuple(s["actions"]): s for s in _gpu_statements()}
    secrets = by_action[("secretsmanager:GetSecretValue",)]
    parameters = by_action[("ssm:GetParameter",)]
    assert secrets["resources"] == "${local.hf_token_arns.secretsmanager}"
    assert parameters["resources"] == "${local.hf_token_arns.ssm}"
    arns = parsed(REGION)["locals"]
    text = json.dumps(arns)
    assert "g.engine.hf_token if g.engine.hf_token != null" in text  # the pools' own
    assert ":secret:%s-??????" in text and ":parameter/%s" in text
    # every statement of the GPU hosts names its resources: none is on every resource
    assert {s["resources"] for s in _gpu_statements()} == {
        "${[for g in aws_autoscaling_group.gpu : g.arn]}",
        "${local.hf_token_arns.secretsmanager}",
        "${local.hf_token_arns.ssm}",
    }


def test_the_fleet_wide_engine_variable_is_gone() -> None:
    """Each pool brings its engine: neither the region module nor the example takes one for
    the whole fleet."""
    for module in (REGION, TF / "examples" / "multi-region"):
        names = {n for block in parsed(module)["variable"] for n in block}
        assert "engine" not in names, module


# -- the rendered GPU-host user data -----------------------------------------------------------
FAKE_AWS = """#!/bin/bash
echo "$*" >>"$FAKE_LOG"
echo hf_secret_value
"""


# the example fleet with a model whose shape is a config.json (next to the file), served in
# two versions by a split, with an alias and an SLO class
EVERY_KIND_OF_MODEL = """
[[models]]
name = "gpt-oss-120b"
config_json = "gpt-oss-120b.json"
aliases = ["oss"]
split = { "gpt-oss-120b@v1" = 90, "gpt-oss-120b@v2" = 10 }
slo_class = "batch"

[[models]]
name = "gpt-oss-120b@v1"
weights = "openai/gpt-oss-120b"

[[models]]
name = "gpt-oss-120b@v2"
weights = "example-org/gpt-oss-120b-v2"

[[regions]]
name = "us-west"
jurisdiction = "us"
location = { lat = 45.6, lon = -121.2 }
deploy = { aws_region = "us-west-2" }

  [[regions.gpu_pools]]
  name = "oss-v1"
  gpu = "H200"
  count = 8
  models = ["gpt-oss-120b@v1"]

  [[regions.gpu_pools]]
  name = "oss-v2"
  gpu = "H200"
  count = 8
  models = ["gpt-oss-120b@v2"]
"""


@pytest.fixture(scope="module")
def models_fleet(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fleet")
    shutil.copy(REPO / "tests" / "fixtures" / "hf_configs" / "gpt-oss-120b.json", folder)
    path = folder / "fleet.toml"
    path.write_text(FLEET.read_text() + EVERY_KIND_OF_MODEL)
    return path


@pytest.fixture(scope="module")
def scripts(terraform, tmp_path_factory, models_fleet) -> dict[str, str]:
    """Every user data the templates render, the routers' with the models_fleet's
    [[models]] as `gpuroute tfvars` writes them."""
    models = fleet_tfvars(load_deploy_fleet(models_fleet), models_fleet)["models"]
    work = tmp_path_factory.mktemp("templates")
    return rendered_templates(terraform, work, {"models": models})


@pytest.fixture(scope="module")
def gpu_scripts(scripts) -> dict[str, str]:
    return {k: v for k, v in scripts.items() if k.startswith("gpu_node")}


def test_every_user_data_fits_ec2s_16_kb(scripts) -> None:
    """EC2 takes 16 KB of user data; Terraform sends it gzipped and base64-encoded
    (base64gzip). Every script, the largest GPU host (eight engines and agents) and the
    router with a config.json model included, stays under 16 KB even as base64, which
    leaves a third to spare: requirements.lock (190 KB) is downloaded, not inlined."""
    names = {"consul_server", "router", "global", "gpu_node", "gpu_node_eight_engines"}
    assert names <= set(scripts)
    for name, script in scripts.items():
        sent = base64.b64encode(gzip.compress(script.encode(), compresslevel=6))
        print(f"user data {name}: {len(sent)} bytes")  # docs/benchmarks.md (pytest -s)
        assert len(sent) <= 16384, f"{name}: {len(sent)} bytes of user data"
        assert "--hash=sha256:" not in script, name


@pytest.mark.parametrize("output", ["router", "global", "gpu_node", "gpu_node_eight_engines"])
def test_hosts_install_only_the_requirements_lock_of_this_repository(
    scripts, tmp_path, output
) -> None:
    """The install step, run with a fake curl that serves a file: the repository's own lock
    passes the sha256 rendered into user data, a changed one stops the script before pip."""
    script = scripts[output]
    step = script[script.index("curl -fsSL --proto '=https' -o /etc/gpuroute/requirements.lock") :]
    step = step[: step.index("python3 -m venv")]
    lock = (REPO / "requirements.lock").read_bytes()
    assert f"echo '{hashlib.sha256(lock).hexdigest()}  /etc/gpuroute/" in step
    assert "'https://artifacts.example.internal/gpuroute/requirements.lock'" in step
    fake = tmp_path / "bin" / "curl"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\nwhile [ "$1" != -o ]; do shift; done\ncp "$SERVED" "$2"\n')
    fake.chmod(0o755)
    step = step.replace("/etc/gpuroute/", f"{tmp_path}/")
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    tampered = tmp_path / "tampered.lock"
    tampered.write_bytes(lock.replace(b"aiohttp==", b"aiohttp>="))
    for served, ok in ((REPO / "requirements.lock", True), (tampered, False)):
        env["SERVED"] = str(served)
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", step], env=env,
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        assert (run.returncode == 0) is ok, (served, run.stderr)
        assert ok or "computed checksum did NOT match" in run.stderr, run.stderr


def test_the_fleets_models_reach_the_routers(scripts, models_fleet, tmp_path) -> None:
    """What the fleet file says about models is what every regional router reads: names,
    aliases, split, fallbacks, SLO class, and the same shapes (a config.json travels as its
    text and is read on the router host as the fleet read it)."""
    files = write_heredocs(scripts["router"], tmp_path)
    assert "models/3.json" in files and 'config_json = "models/3.json"' in files["router.toml"]
    router = load_router_config(tmp_path / "router.toml")
    fleet = load_deploy_fleet(models_fleet)

    def table(models) -> list[tuple]:
        return [(m.name, m.aliases, m.split, m.fallback, m.slo_class) for m in models]

    assert table(router.models) == table(fleet.models)
    served = [m.name for m in fleet.models] + ["gpt-oss-120b@v1", "gpt-oss-120b@v2"]
    assert {n: router.shapes()[n] for n in served} == {n: fleet.shapes()[n] for n in served}
    assert router.shapes()["gpt-oss-120b"].family == "gpt_oss"


def test_tfvars_carries_the_fleets_models_and_gpu_types(models_fleet) -> None:
    """Top-level `models` (the routers' keys only: no weights, no SLO; a config.json as its
    JSON) and `gpu_types` (the declared figures, without their AWS instances)."""
    out = fleet_tfvars(load_deploy_fleet(models_fleet), models_fleet)
    by_name = {m["name"]: m for m in out["models"]}
    assert by_name["llama-3.1-70b"] == {"name": "llama-3.1-70b", "fallback": ["llama-3.1-8b"]}
    assert by_name["llama-3.1-8b"] == {"name": "llama-3.1-8b", "aliases": ["llama-8b"]}
    oss = by_name["gpt-oss-120b"]
    config = json.loads((models_fleet.parent / "gpt-oss-120b.json").read_text())
    assert json.loads(oss.pop("config_json_text")) == config
    assert oss == {"name": "gpt-oss-120b", "aliases": ["oss"], "slo_class": "batch",
                   "split": {"gpt-oss-120b@v1": 90, "gpt-oss-120b@v2": 10}}  # fmt: skip
    assert not any({"weights", "slo", "config_json"} & set(m) for m in out["models"])
    assert out["gpu_types"] == [{
        "name": "RTX-PRO-6000", "memory_gb": 96, "memory_bandwidth_tbs": 1.79,
        "fp16_tflops": 500, "fp8_tflops": 1000, "interconnect_gbs": 64.0,
        "price_per_hour": 3.4, "tdp_w": 0.0,
        "device_names": ["NVIDIA RTX PRO 6000 Blackwell Server Edition"],
    }]  # fmt: skip


def test_every_gpu_user_data_is_a_valid_bash_script(gpu_scripts, tmp_path) -> None:
    for name, script in gpu_scripts.items():
        (tmp_path / name).write_text(script)
        checked = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True)
        assert checked.returncode == 0, f"{name}: {checked.stderr.decode()}"


@pytest.mark.parametrize(
    ("output", "call"),
    [
        ("gpu_node", "secretsmanager get-secret-value --region eu-central-1 "
         "--secret-id gpuroute/hf-token --query SecretString --output text"),
        ("gpu_node_sglang", "ssm get-parameter --region eu-central-1 --with-decryption "
         "--name /gpuroute/hf-token --query Parameter.Value --output text"),
    ],
)  # fmt: skip
def test_the_engine_reads_its_token_into_a_file_only_it_reads(
    gpu_scripts, tmp_path, output, call
) -> None:
    """The ExecStartPre helper, run against a fake `aws`: one call to the pool's store, the
    token in an env file of mode 0600 that docker --env-file reads (HF_TOKEN)."""
    script = re.search(
        r"cat > /usr/local/bin/gpuroute-hf-token <<'SCRIPT'\n(.*?)\nSCRIPT\n",
        gpu_scripts[output], re.S,
    ).group(1)  # fmt: skip
    helper, fake = tmp_path / "gpuroute-hf-token", tmp_path / "bin" / "aws"
    helper.write_text(script)
    fake.parent.mkdir()
    fake.write_text(FAKE_AWS)
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
           "FAKE_LOG": str(tmp_path / "calls")}  # fmt: skip
    env_file = tmp_path / "run" / "hf-token.env"
    env_file.parent.mkdir()
    subprocess.run(["bash", str(helper), str(env_file)], env=env, check=True, timeout=30)
    assert (tmp_path / "calls").read_text().splitlines() == [call]
    token = "hf_secret_value"
    assert env_file.read_text() == f"HF_TOKEN={token}\nHUGGING_FACE_HUB_TOKEN={token}\n"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert token not in gpu_scripts[output]


def test_routers_reach_each_engine_and_its_load_stream_and_nothing_between() -> None:
    """One rule per port fleet-plan gave an engine of the region's hosts, from the routers'
    security group alone: each engine's port and its agent's load stream (the agents' admin
    ports stay closed to routers). The mocked plan in examples/multi-region checks the ports
    a real fleet gets (8000, 8001 and 7070, 7072 for two engines a host)."""
    rules = resources(REGION, "aws_vpc_security_group_ingress_rule")
    for name, ports in (("engine_from_routers", "engine_ports"),
                        ("load_stream_from_routers", "load_stream_ports")):  # fmt: skip
        rule = rules[name]
        assert rule["for_each"] == "${local." + ports + "}"
        assert rule["from_port"] == rule["to_port"] == "${each.key}"
        assert rule["referenced_security_group_id"] == "${aws_security_group.router.id}"
        assert "cidr_ipv4" not in rule
    locals_ = {k: v for b in parsed(REGION)["locals"] for k, v in b.items()}
    assert "e.port" in locals_["engine_ports"]
    assert "e.load_stream_port" in locals_["load_stream_ports"]
    assert "admin_port" not in locals_["engine_ports"] + locals_["load_stream_ports"]
