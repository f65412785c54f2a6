"""Deployment: Terraform formatting and tests, `terraform validate` where providers can be
installed, HCL invariants checked with python-hcl2, `gpuroute tfvars`, the systemd units."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gpuroute.fleet.tfvars import fleet_tfvars, render_tfvars
from support.paths import REPO
from support.terraform import (
    TF,
    apply_offline,
    copy_module,
    heredocs,
    init_with_providers,
    parsed,
    rendered_templates,
    resources,
    tf,
    write_heredocs,
)

from gpuroute.config import ConfigError

PURE_MODULES = [
    TF / "modules" / "fleet-plan",
    TF / "modules" / "gpu-autoscaling",
    TF / "tests" / "templates",
]
AWS_MODULES = [
    TF / "modules" / "region",
    TF / "modules" / "global",
    TF / "modules" / "peering",
    TF / "examples" / "multi-region",
]
ALL_MODULES = [*PURE_MODULES, *AWS_MODULES]
PROTECTED_PORTS = {8300, 8301, 8302, 8500, 8501, 8502, 8503, 8600, 7070, 7071, 9090, 9100}
WORLD = ("0.0.0.0/0", "::/0")
# `terraform init` may download providers, and each terraform command may take 300 s
pytestmark = pytest.mark.timeout(900)


# -- Terraform CLI ---------------------------------------------------------------------------
def test_fmt_check(terraform) -> None:
    tf(terraform, "fmt", "-check", "-recursive", "-diff", str(TF), cwd=REPO)


@pytest.mark.parametrize("module", PURE_MODULES, ids=lambda p: p.name)
def test_terraform_test_on_provider_free_modules(terraform, module, tmp_path) -> None:
    work = copy_module(module, tmp_path)
    tf(terraform, "init", "-backend=false", "-input=false", cwd=work)
    result = tf(terraform, "test", "-no-color", cwd=work)
    assert "0 failed" in result.stdout and " passed" in result.stdout


def test_every_rendered_config_passes_check_config(terraform, tmp_path) -> None:
    """Each template, rendered with the example's variables, writes TOML that the process it
    starts accepts: the global tier's config once carried the router's [membership] and
    crash-looped, and routers set no report_listen, so discovery found nothing."""
    scripts = rendered_templates(terraform, tmp_path)
    kinds = {"router": "router", "global": "global", "gpu_node": "agent",
             "gpu_node_sglang": "agent", "gpu_node_public_model": "agent",
             "gpu_node_eight_engines": "agent"}  # fmt: skip
    for output, kind in kinds.items():
        config_dir = tmp_path / output
        files = write_heredocs(scripts[output], config_dir)
        # a GPU host writes one agent config per engine: each must load
        mains = [n for n in files if n.endswith(".toml") and n != "regions.toml"]
        assert mains and (kind != "agent" or all(n.startswith("agent-") for n in mains))
        for main in mains:
            checked = subprocess.run(
                [sys.executable, "-m", "gpuroute.cli", "check-config", "--kind", kind,
                 str(config_dir / main)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert checked.returncode == 0, f"{output} {main}: {checked.stderr}"
    assert sorted(heredocs(scripts["gpu_node"])) == ["agent-0.toml", "agent-1.toml"]
    assert len(heredocs(scripts["gpu_node_eight_engines"])) == 8
    router = (tmp_path / "router" / "router.toml").read_text()
    assert "report_listen" in router and "[[auth.keys]]" in router
    # the fixture's [[models]]: a fallback with its SLO class, aliases and a split, a
    # built-in shape with its dtypes, an explicit shape
    assert router.count("[[models]]") == 4
    assert 'split = { "llama-3.1-8b@v1" = 90, "llama-3.1-8b@v2" = 10 }' in router


@pytest.mark.parametrize("module", AWS_MODULES, ids=lambda p: p.name)
def test_validate_where_providers_can_be_installed(terraform, module, tmp_path) -> None:
    work = copy_module(module, tmp_path)
    # a module that takes aliased providers (peering: configuration_aliases) gets them from
    # its caller; validated alone, the copy declares them
    aliases = re.findall(r"aws\.(\w+)", "".join(re.findall(
        r"configuration_aliases\s*=\s*\[([^]]*)\]", (work / "versions.tf").read_text()
    )))  # fmt: skip
    if aliases:
        blocks = [f'provider "aws" {{\n  alias = "{a}"\n}}\n' for a in aliases]
        (work / "validate_providers.tf").write_text("\n".join(blocks))
    if reason := init_with_providers(terraform, work):
        print(f"\n{module.name}: terraform validate skipped, providers not installable: {reason}")
        pytest.skip(f"providers cannot be installed here ({reason})")
    tf(terraform, "validate", "-no-color", cwd=work)


def test_the_multi_region_fleet_plans_with_a_mocked_aws_provider(terraform, tmp_path) -> None:
    """examples/multi-region/tests: `terraform plan` of fleet.example.toml, the issue's fleet
    (three regions, two TP4 engines per p5e, 8B on L40S and A10G, an autoscaling pool), from
    `gpuroute tfvars`, with the AWS provider mocked: its schema checks every resource, no
    credentials needed; then again with tokens from SSM and a full ARN."""
    work = copy_module(TF / "examples" / "multi-region", tmp_path)
    if reason := init_with_providers(terraform, work):
        pytest.skip(f"providers cannot be installed here ({reason})")
    # what the operator runs: `gpuroute tfvars fleet.example.toml > terraform.tfvars.json`
    (work / "terraform.tfvars.json").write_text(render_tfvars(REPO / "fleet.example.toml"))
    result = tf(terraform, "test", "-no-color", cwd=work)
    assert "0 failed" in result.stdout and "2 passed" in result.stdout, result.stdout


def example_plan(binary: str, tmp_path: Path) -> dict:
    """`gpuroute tfvars regions.example.toml` fed to fleet-plan, applied offline."""
    regions = json.loads(render_tfvars(REPO / "regions.example.toml"))["regions"]
    return apply_offline(
        binary, copy_module(TF / "modules" / "fleet-plan", tmp_path), {"regions": regions}
    )


def test_tfvars_for_the_example_flow_through_the_plan_module(terraform, tmp_path) -> None:
    """`gpuroute tfvars regions.example.toml` fed to the pure module, applied offline:
    every region gets 3 Consul servers in distinct AZs and non-overlapping addresses."""
    out = example_plan(terraform, tmp_path)
    servers = out["consul_servers"]["value"]
    assert set(servers) == {"us-east", "eu-west", "ap-northeast"}
    for region, members in servers.items():
        assert len(members) == 3 and len({m["az"] for m in members}) == 3, region
    assert sorted(out["vpc_cidrs"]["value"].values()) == [
        "10.64.0.0/16", "10.65.0.0/16", "10.66.0.0/16",
    ]  # fmt: skip
    assert out["failover_order"]["value"]["eu-west"] == ["us-east", "ap-northeast"]
    assert len(out["federation_pairs"]["value"]) == 3


def test_the_example_pools_pass_the_autoscaling_module(terraform, tmp_path) -> None:
    """fleet-plan's node groups for the example, fed to gpu-autoscaling as modules/region
    feeds them: the autoscaling pool gets its bounds, warm pool and a policy on its model's
    desired backends (eu-west's only llama-3.1-8b group); the others stay fixed at their
    host count."""
    groups = example_plan(terraform, tmp_path)["gpu_node_groups"]["value"]
    assert [k for k in groups if k.startswith("eu-west/")] == ["eu-west/l4-0"]
    work = copy_module(TF / "modules" / "gpu-autoscaling", tmp_path)
    out = apply_offline(terraform, work, {"node_groups": groups, "drain": {"timeout_s": 60}})
    scaled = out["groups"]["value"]
    l4 = scaled["eu-west/l4-0"]
    assert (l4["min_size"], l4["desired_capacity"], l4["max_size"]) == (8, 16, 32)
    assert l4["warm_pool"]["min_size"] == 2 and l4["warm_pool"]["pool_state"] == "Running"
    assert l4["pool"] == "llama-3.1-8b"
    assert l4["scaling_policy"]["desired"]["dimensions"] == {"pool": "llama-3.1-8b"}
    fixed = {k: g for k, g in scaled.items() if k != "eu-west/l4-0"}
    assert fixed and all(
        g["min_size"] == g["max_size"] == g["desired_capacity"] for g in fixed.values()
    )
    assert all(g["scaling_policy"] is None and g["warm_pool"] is None for g in fixed.values())


def test_gpu_autoscaling_names_the_groups_that_break_the_one_group_per_model_rule(
    terraform, tmp_path
) -> None:
    """An autoscaling group serves one model, which no other group of its region serves;
    Terraform's errors name the groups (and the model they share)."""
    work = copy_module(TF / "modules" / "gpu-autoscaling", tmp_path)
    groups = {
        "eu-west/a100-0": {"hosts": 1, "models": ["llama-3.1-8b", "llama-3.1-70b"]},
        "eu-west/l4-1": {"hosts": 8, "min_hosts": 4, "max_hosts": 16, "models": ["llama-3.1-8b"]},
        "us-east/l4-0": {"hosts": 2, "min_hosts": 1, "max_hosts": 4, "models": ["a", "b"]},
        # the same model in another region is another pool; fixed groups may share one
        "us-east/h100-1": {"hosts": 1, "models": ["llama-3.1-8b", "c"]},
        "us-east/h100-2": {"hosts": 1, "models": ["c"]},
    }
    (work / "bad.tfvars.json").write_text(
        json.dumps({"node_groups": groups, "drain": {"timeout_s": 60}})
    )
    tf(terraform, "init", "-backend=false", "-input=false", cwd=work)
    plan = tf(terraform, "plan", "-no-color", "-input=false", "-var-file=bad.tfvars.json",
              cwd=work, check=False)  # fmt: skip
    assert plan.returncode != 0
    errors = " ".join(plan.stderr.replace("│", " ").split())  # Terraform wraps its messages
    assert "serves exactly one model" in errors and "us-east/l4-0 serves a, b." in errors
    assert "No other GPU group of its region may serve the model of an autoscaling group" in errors
    assert "eu-west/a100-0 and eu-west/l4-1 both serve llama-3.1-8b." in errors
    assert errors.count("Invalid value for variable") == 2, errors


# -- HCL invariants --------------------------------------------------------------------------
@pytest.mark.parametrize("module", ALL_MODULES, ids=lambda p: p.name)
def test_every_variable_has_a_description_and_a_type(module) -> None:
    for block in parsed(module).get("variable", []):
        for name, body in block.items():
            assert body.get("description"), f"{module.name}: variable {name} has no description"
            assert "type" in body, f"{module.name}: variable {name} has no type"


@pytest.mark.parametrize("module", ALL_MODULES, ids=lambda p: p.name)
def test_secrets_are_marked_sensitive(module) -> None:
    secret = re.compile(r"(token|secret|password|gossip_key|private_key)")
    for block in parsed(module).get("variable", []):
        for name, body in block.items():
            if secret.search(name):
                assert body.get("sensitive") is True, f"{module.name}: {name} is not sensitive"


def _ports(rule: dict) -> set[int] | None:
    """The literal port range of a rule, or None when it is an expression."""
    low, high = rule.get("from_port"), rule.get("to_port")
    if isinstance(low, int) and isinstance(high, int):
        return set(range(low, high + 1))
    return None


def test_no_security_group_opens_consul_agent_or_admin_ports_to_the_world() -> None:
    region = TF / "modules" / "region"
    text = "\n".join(p.read_text() for p in region.glob("*.tf"))
    ingress = resources(region, "aws_vpc_security_group_ingress_rule")
    assert ingress, "the region module defines its ingress rules as separate resources"
    assert not resources(region, "aws_security_group_rule")
    for group in resources(region, "aws_security_group").values():
        assert "ingress" not in group, "inline ingress blocks escape this check"
    world_reachable = []
    for name, rule in ingress.items():
        source = str(rule.get("cidr_ipv4", "")) + str(rule.get("cidr_ipv6", ""))
        assert not any(w in source for w in WORLD), f"rule {name} names the whole internet"
        if "client_cidrs" in str(rule.get("for_each", "")) + source:
            world_reachable.append(name)
            ports = {80, 443} if "tls_certificate_arn" in str(rule["from_port"]) else _ports(rule)
            assert ports and not ports & PROTECTED_PORTS, f"{name} opens {ports} to clients"
        elif (ports := _ports(rule)) is not None and ports & PROTECTED_PORTS:
            assert (
                "referenced_security_group_id" in rule
                or "var.vpc_cidr" in source
                or "each.value.cidr" in source
            ), f"{name}: ports {sorted(ports & PROTECTED_PORTS)} open to {source}"
    assert world_reachable == ["api"], world_reachable
    assert text.count("var.client_cidrs") == 1  # used by the API rule and nothing else
    # the CIDR lists that reach protected ports reject the whole internet
    variables = {n: b for blk in parsed(region)["variable"] for n, b in blk.items()}
    for name in ("admin_cidrs", "wan_peer_cidrs"):
        checks = " ".join(str(v["condition"]) for v in variables[name].get("validation", []))
        assert "0.0.0.0/0" in checks and "::/0" in checks, f"{name} must reject the internet"


def test_every_region_gets_three_consul_servers_in_distinct_azs() -> None:
    region = TF / "modules" / "region"
    server = resources(region, "aws_instance")["consul_server"]
    assert server["count"] == "${length(var.consul_servers)}"
    assert "var.consul_servers[count.index].az" in server["availability_zone"]
    variables = {n: b for blk in parsed(region)["variable"] for n, b in blk.items()}
    condition = str(variables["consul_servers"]["validation"][0]["condition"])
    assert ">= 3" in condition and "distinct" in condition
    plan_vars = {
        n: b for blk in parsed(TF / "modules" / "fleet-plan")["variable"] for n, b in blk.items()
    }
    assert plan_vars["consul_servers_per_region"]["default"] == 3


# -- gpuroute tfvars -------------------------------------------------------------------------
def test_tfvars_for_the_example_regions_file() -> None:
    out = json.loads(render_tfvars(REPO / "regions.example.toml"))
    assert out["global_regions"] == ["us-east", "eu-west"]
    regions = out["regions"]
    assert {n: (r["aws_region"], r["cidr_index"]) for n, r in regions.items()} == {
        "us-east": ("us-east-1", 0),
        "eu-west": ("eu-central-1", 1),
        "ap-northeast": ("ap-northeast-1", 2),
    }
    assert regions["ap-northeast"]["azs"] == [
        "ap-northeast-1a",
        "ap-northeast-1c",
        "ap-northeast-1d",
    ]
    assert regions["us-east"]["azs"] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    # Washington-Frankfurt 6,500 km < Washington-Tokyo 10,900 km; Tokyo-Frankfurt 9,300 km
    assert regions["us-east"]["neighbours"] == ["eu-west", "ap-northeast"]
    assert regions["ap-northeast"]["neighbours"] == ["eu-west", "us-east"]
    (pool,) = regions["eu-west"]["gpu_pools"]
    assert {k: pool[k] for k in ("gpu", "count", "models", "min_hosts", "max_hosts")} == {
        "gpu": "L4", "count": 16, "models": ["llama-3.1-8b"], "min_hosts": 8, "max_hosts": 32,
    }  # fmt: skip
    assert (pool["standby_hosts"], pool["instance_type"], pool["gpus_per_host"]) == (
        2, "g6.xlarge", 1,
    )  # fmt: skip
    # the token is a reference: where hosts read it, never the secret
    assert pool["engine"]["hf_token"] == {"source": "secretsmanager", "name": "gpuroute/hf-token"}


def test_tfvars_cli_writes_json(capsys) -> None:
    from gpuroute.cli import main

    assert main(["tfvars", str(REPO / "regions.example.toml")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"regions", "global_regions", "models", "gpu_types"}
    assert out["models"] == out["gpu_types"] == []  # a regions file declares neither


REGION = '[[regions]]\nname = "{name}"\njurisdiction = "us"\nlocation = {{ lat = 1, lon = 2 }}\n'


def region(name: str, deploy: str = 'deploy = { aws_region = "us-east-1" }\n') -> str:
    return REGION.format(name=name) + deploy


def pool(keys: str) -> str:
    return '[[regions.gpu_pools]]\ngpu = "L4"\ncount = 2\nmodels = ["m"]\n' + keys


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[deploy]\nglobal_regions = ["aa", "bb"]\n' + region("aa", "") + region("bb"),
         "regions[0].deploy.aws_region: needed by gpuroute tfvars"),
        ('[deploy]\nglobal_regions = ["aa", "zz"]\n' + region("aa") + region("bb"),
         "deploy.global_regions: unknown region 'zz'"),
        ('[deploy]\nglobal_regions = ["aa"]\n' + region("aa") + region("bb"),
         "name at least two regions"),
        ('[deploy]\nglobal_regions = ["aa", "bb"]\n'
         + region("aa", 'deploy = { aws_region = "us-east-1", cidr_index = 1 }\n') + region("bb"),
         "two regions share a CIDR index"),
        (region("aa", 'deploy = { aws_region = "Virginia" }\n'),
         "regions[0].deploy.aws_region: String should match pattern"),
        (region("aa", 'deploy = { aws_region = "us-east-1", azs = ["x", "y"] }\n'),
         "regions[0].deploy.azs: List should have at least 3 items"),
        (region("aa") + pool("min_hosts = 4\nmax_hosts = 2\n"),
         "regions[0].gpu_pools[0]: min_hosts (4) is above max_hosts (2)"),
        (region("aa") + pool("min_hosts = 1\nmax_hosts = 3\nstandby_hosts = 3\n"),
         "regions[0].gpu_pools[0]: standby_hosts (3) is more than the group can grow by "
         "(max_hosts - min_hosts = 2)"),
        (region("aa") + pool("standby_hosts = 1\n"),
         "regions[0].gpu_pools[0]: standby_hosts needs min_hosts or max_hosts"),
        (region("aa") + pool("min_hosts = 0\nmax_hosts = 2\n"),
         "regions[0].gpu_pools[0].min_hosts: must be >= 1"),
        (region("aa") + pool("max_hosts = 4\n").replace('["m"]', '["m", "n"]'),
         "regions[0].gpu_pools[0]: a pool that scales (min_hosts, max_hosts or standby_hosts) "
         "serves exactly one model"),
        ('[[models]]\nname = "qwen3-8b"\nslo_class = "gold"\n' + region("aa")
         + pool("engine = { max_model_len = 8192 }\n").replace('["m"]', '["qwen3-8b"]'),
         "models[0].slo_class: 'gold' is not a class the deployed routers have "
         "(interactive, standard, batch)"),
        (region("aa") + pool("") + pool("min_hosts = 1\nmax_hosts = 4\n"),
         "regions[0].gpu_pools[1]: a pool that scales is the only pool of its region serving "
         "its model, but regions[0].gpu_pools[0] also serves 'm'"),
    ],
)  # fmt: skip
def test_tfvars_rejects_a_bad_regions_file_naming_file_and_key(tmp_path, text, message) -> None:
    path = tmp_path / "regions.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        render_tfvars(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_fleet_tfvars_neighbours_are_sorted_by_distance() -> None:
    from gpuroute.fleet.schema import DeployFleet

    fleet = DeployFleet.model_validate(
        {
            "deploy": {"global_regions": ["ra", "rb"]},
            "regions": [
                {"name": n, "jurisdiction": "us", "location": {"lat": 0, "lon": lon},
                 "deploy": {"aws_region": "us-east-1"}}
                for n, lon in (("ra", 0), ("rb", 90), ("rc", 10), ("rd", -40))
            ],
        }
    )  # fmt: skip
    regions = fleet_tfvars(fleet, "x.toml")["regions"]
    assert regions["ra"]["neighbours"] == ["rc", "rd", "rb"]
    assert regions["rb"]["neighbours"] == ["rc", "ra", "rd"]


# -- systemd units -----------------------------------------------------------------------------
def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in systemd
    parser.read(REPO / "deploy" / "systemd" / name)
    return parser


@pytest.mark.parametrize(
    ("name", "drain_s"),
    [
        ("gpuroute-agent.service", 60 + 1),  # agent.example.toml: drain_timeout_s + grace
        ("gpuroute-router.service", 30),  # router.example.toml: drain_timeout_s
        ("gpuroute-global.service", 30),
    ],
)
def test_units_restart_drain_within_their_stop_timeout_and_are_hardened(name, drain_s) -> None:
    service = unit(name)["Service"]
    assert service["Restart"] == "on-failure" and service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > drain_s
    assert service["User"] == "gpuroute" and service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict" and service["ProtectHome"] == "yes"
    assert service["CapabilityBoundingSet"] == ""
    assert service["ExecStart"].startswith("/opt/gpuroute/bin/gpuroute ")


def test_example_drain_timeouts_match_the_units() -> None:
    from gpuroute.agent.config import load_agent_config
    from gpuroute.router.config.router import RouterConfig

    agent = load_agent_config(REPO / "agent.example.toml")
    agent_stop = int(unit("gpuroute-agent.service")["Service"]["TimeoutStopSec"])
    router_stop = int(unit("gpuroute-router.service")["Service"]["TimeoutStopSec"])
    assert agent.drain_timeout_s + agent.drain_grace_s < agent_stop
    assert RouterConfig.model_fields["drain_timeout_s"].default < router_stop


def test_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^USER gpuroute", text, re.M)
    assert "HEALTHCHECK" in text and "STOPSIGNAL SIGTERM" in text
    assert re.search(r"^ENTRYPOINT \[\"gpuroute\"\]", text, re.M)
