"""GPU node groups that autoscale (docs/deploy.md, "Autoscaling"). modules/gpu-autoscaling's
values are covered by `terraform test` (test_deploy runs it); these check that the AWS
resources of modules/region take them (python-hcl2: no provider here), that the routers
publish the metric the policies read, and the GPU hosts' lifecycle watcher, run against
fakes of IMDS, the agent's CLI and the AWS CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from support.terraform import TF, parsed, rendered_templates, resources

REGION = TF / "modules" / "region"
AUTOSCALING = TF / "modules" / "gpu-autoscaling"
WATCHER = REGION / "files" / "gpuroute-lifecycle.sh"
METRIC = "gpuroute_pool_desired_backends"


def from_module(name: str) -> str:
    """How an argument reads that takes this output of modules/gpu-autoscaling."""
    return "${module.autoscaling." + name + "}"


def dynamic(body: dict, name: str) -> dict:
    blocks = [d[name] for d in body.get("dynamic", []) if name in d]
    assert len(blocks) == 1, f"one dynamic {name} block"
    return blocks[0]


def iam_statements() -> list[dict]:
    """The host roles' statements, fixed and dynamic (with the dynamic's for_each)."""
    doc = next(
        b["aws_iam_policy_document"]["host"]
        for b in parsed(REGION)["data"]
        if "host" in b.get("aws_iam_policy_document", {})
    )
    dynamic_ones = [
        {**d["statement"]["content"][0], "for_each": d["statement"]["for_each"]}
        for d in doc.get("dynamic", [])
    ]
    return doc["statement"] + dynamic_ones


# -- modules/region: the AWS resources take gpu-autoscaling's values -------------------------
def test_the_region_feeds_every_gpu_group_through_gpu_autoscaling() -> None:
    module = next(m["autoscaling"] for m in parsed(REGION)["module"] if "autoscaling" in m)
    assert module["source"] == "../gpu-autoscaling"
    assert module["node_groups"] == "${var.gpu_node_groups}"
    assert module["drain"]["timeout_s"] == "${var.drain_timeout_s}"  # the agents' drain


def test_every_gpu_group_spans_its_bounds_with_a_warm_pool() -> None:
    asg = resources(REGION, "aws_autoscaling_group")["gpu"]
    assert asg["for_each"] == "${var.gpu_node_groups}"
    for field in ("min_size", "max_size", "desired_capacity"):
        assert asg[field] == from_module(f"groups[each.key].{field}")
    assert "each.value.hosts" not in json.dumps(asg), "min = max = hosts again"
    assert asg["enabled_metrics"] == from_module("enabled_metrics")
    assert asg["metrics_granularity"] == "1Minute"
    warm = dynamic(asg, "warm_pool")
    assert warm["for_each"] == from_module("groups[each.key].warm_pool[*]")
    content = warm["content"][0]
    for field in ("pool_state", "min_size", "max_group_prepared_capacity"):
        assert content[field] == "${warm_pool.value." + field + "}"
    reuse = content["instance_reuse_policy"][0]["reuse_on_scale_in"]
    assert reuse == "${warm_pool.value.reuse_on_scale_in}"
    # the policy owns the desired capacity once the group exists
    assert "desired_capacity" in asg["lifecycle"][0]["ignore_changes"]


def test_every_gpu_group_drains_through_a_terminating_hook() -> None:
    hooks = resources(REGION, "aws_autoscaling_lifecycle_hook")
    assert list(hooks) == ["drain"]
    hook = hooks["drain"]
    assert hook["for_each"] == "${var.gpu_node_groups}"  # fixed groups drain too
    assert hook["autoscaling_group_name"] == "${aws_autoscaling_group.gpu[each.key].name}"
    for field in ("name", "lifecycle_transition", "heartbeat_timeout", "default_result"):
        assert hook[field] == from_module(f"lifecycle_hook.{field}")
    # the hosts' watcher completes the hook by that name
    template = resources(REGION, "aws_launch_template")["gpu"]
    assert "lifecycle_hook = module.autoscaling.lifecycle_hook.name" in template["user_data"]


def test_the_policy_tracks_desired_backends_per_host_in_service() -> None:
    policy = resources(REGION, "aws_autoscaling_policy")["desired_backends"]
    assert "scaling_policy if g.scaling_policy != null" in policy["for_each"]
    assert policy["autoscaling_group_name"] == "${aws_autoscaling_group.gpu[each.key].name}"
    tracking = policy["target_tracking_configuration"][0]
    assert tracking["target_value"] == "${each.value.target_value}"
    metrics = {m["id"]: m for m in tracking["customized_metric_specification"][0]["metrics"]}
    returned = [m for m in metrics.values() if m["return_data"] is True]
    assert [m["expression"] for m in returned] == ["${each.value.expression}"]
    desired = metrics["${each.value.desired.id}"]["metric_stat"][0]
    assert desired["metric"][0]["metric_name"] == "${each.value.desired.metric_name}"
    assert dynamic(desired["metric"][0], "dimensions")["for_each"] == (
        "${each.value.desired.dimensions}"
    )
    in_service = metrics["${each.value.in_service.id}"]["metric_stat"][0]["metric"][0]
    assert in_service["dimensions"] == [
        {"name": "AutoScalingGroupName", "value": "${aws_autoscaling_group.gpu[each.key].name}"}
    ]


def test_the_policys_pool_is_the_model_its_group_serves() -> None:
    """The routers export the desired backends per model pool (`pool` = the model), so the
    policy's dimension is the group's model, never its name in the region (`l4-1`), and only
    a group that is its model's one group in its region may scale on it."""
    module = parsed(AUTOSCALING)
    groups = module["locals"][0]["groups"]
    pool = re.search(r"\bpool = (.+?), min = ", groups)
    assert pool, groups
    assert pool.group(1) == "length(distinct(g.models)) == 1 ? g.models[0] : null"
    policy = module["output"][0]["groups"]["value"]
    assert "pool = g.pool" in policy and "dimensions = {pool = g.pool}" in policy
    node_groups = module["variable"][0]["node_groups"]
    assert "models = list(string)" in node_groups["type"]
    checks = [str(v["condition"]) for v in node_groups["validation"]]
    scales = (
        "coalesce(g.max_hosts, g.hosts) > coalesce(g.min_hosts, g.hosts) || g.standby_hosts > 0"
    )
    assert any("length(distinct(g.models)) != 1" in c and scales in c for c in checks)
    shared = [c for c in checks if "setintersection(g.models, o.models)" in c]
    assert len(shared) == 1 and scales in shared[0]
    assert 'split("/", k2)[0] == split("/", k)[0]' in shared[0]  # within a region
    # modules/region passes each group's models (fleet-plan's) and tags hosts with the pool
    region_groups = next(
        b["gpu_node_groups"] for b in parsed(REGION)["variable"] if "gpu_node_groups" in b
    )
    assert "models = list(string)" in region_groups["type"]
    template = resources(REGION, "aws_launch_template")["gpu"]
    tags = template["tag_specifications"][0]["tags"]
    assert '"gpuroute:pool" = module.autoscaling.groups[each.key].pool' in tags
    assert "if pool != null" in tags


def test_the_routers_publish_the_metric_the_policies_read() -> None:
    """One name across the pure module's policy and the routers' CloudWatch agent, and one
    namespace: the router template takes the module's."""
    main = (TF / "modules" / "gpu-autoscaling" / "main.tf").read_text()
    assert re.search(rf'^\s*metric_name = "{METRIC}"$', main, re.M)
    template = (REGION / "templates" / "router.sh.tftpl").read_text()
    assert f'"regex": "{METRIC}"' in template and f'"^{METRIC}$"' in template
    router = resources(REGION, "aws_launch_template")["router"]
    assert "metric_namespace = module.autoscaling.metric.namespace" in router["user_data"]


def test_hosts_get_only_what_scaling_needs() -> None:
    """GPU hosts complete the hook of their region's GPU groups, by ARN; regional routers
    write to their metrics log group; nobody gets autoscaling or logs on everything."""
    statements = iam_statements()
    for statement in statements:
        granted = " ".join(statement["actions"])
        if "autoscaling:" in granted or "logs:" in granted:
            assert statement["resources"] != ["*"], statement
    complete = next(s for s in statements if "autoscaling:CompleteLifecycleAction" in s["actions"])
    assert complete["actions"] == ["autoscaling:CompleteLifecycleAction"]
    assert complete["resources"] == "${[for g in aws_autoscaling_group.gpu : g.arn]}"
    assert 'each.key == "gpu"' in complete["for_each"]
    logs = next(s for s in statements if "logs:PutLogEvents" in s["actions"])
    assert all("aws_cloudwatch_log_group.router_metrics.arn" in r for r in logs["resources"])
    assert 'each.key == "regional"' in logs["for_each"]


# -- the rendered user data ------------------------------------------------------------------
def heredoc(script: str, path: str, marker: str) -> str:
    found = re.search(rf"cat > {re.escape(path)} <<'{marker}'\n(.*?)\n{marker}\n", script, re.S)
    assert found, f"{path} is not written"
    return found.group(1)


def test_the_routers_cloudwatch_agent_keeps_the_desired_backends_by_pool(
    terraform, tmp_path
) -> None:
    router = rendered_templates(terraform, tmp_path)["router"]
    etc = "/opt/aws/amazon-cloudwatch-agent/etc"
    scrape = json.loads(heredoc(router, f"{etc}/prometheus.yaml", "YAML"))  # JSON is YAML
    [job] = scrape["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9090"]}]  # the admin listener
    assert job["authorization"] == {"credentials_file": "/etc/gpuroute/admin-token"}
    assert job["metric_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": METRIC, "action": "keep"}
    ]
    agent = json.loads(heredoc(router, f"{etc}/gpuroute.json", "JSON"))
    prometheus = agent["logs"]["metrics_collected"]["prometheus"]
    assert prometheus["prometheus_config_path"] == f"{etc}/prometheus.yaml"
    emf = prometheus["emf_processor"]
    assert emf["metric_namespace"] == "gpuroute"
    assert emf["metric_declaration"] == [
        {
            "source_labels": ["job"],
            "label_matcher": f"^{job['job_name']}$",
            "dimensions": [["pool"]],
            "metric_selectors": [f"^{METRIC}$"],
        }
    ]
    assert agent["agent"]["run_as_user"] == "cwagent"
    assert "usermod -a -G gpuroute cwagent" in router  # reads the admin token


def test_the_gpu_node_installs_the_watcher_it_was_given(terraform, tmp_path) -> None:
    gpu_node = rendered_templates(terraform, tmp_path)["gpu_node"]
    installed = heredoc(gpu_node, "/usr/local/bin/gpuroute-lifecycle", "SCRIPT")
    assert installed.rstrip("\n") == WATCHER.read_text().rstrip("\n")


# -- the lifecycle watcher, against fakes ------------------------------------------------------
FAKE_CURL = """#!/bin/bash
url="${@: -1}"
case "$url" in
    */latest/api/token) echo token ;;
    *) cat "$FAKE_IMDS/${url#*/latest/meta-data/}" 2>/dev/null || exit 22 ;;
esac
"""
FAKE_SYSTEMCTL = """#!/bin/bash
# systemctl show --property InvocationID --value UNIT...: one line per unit
[ "$1 $2 $3 $4" = "show --property InvocationID --value" ] || exit 1
for unit in "${@:5}"; do cat "$FAKE_AGENT_RUN/$unit"; echo; done
"""
FAKE_LOGGING = """#!/bin/bash
echo "$(basename "$0") $*" >>"$FAKE_LOG"
case " $* " in
    *" $FAKE_FAILS "*) exit 1 ;;
    *" ec2 describe-tags "*) echo gpuroute-eu-west-l4-1-20260101 ;;
esac
"""


class Host:
    """A GPU host with two engines as the watcher sees it: IMDS answers from files, and
    `gpuroute` and `aws` only write down how they were called."""

    def __init__(self, root: Path, agents: tuple[int, ...] = (0, 1)) -> None:
        self.root, self.imds, self.log = root, root / "imds", root / "calls.log"
        bin_dir = root / "bin"
        fakes = {"curl": FAKE_CURL, "aws": FAKE_LOGGING, "gpuroute": FAKE_LOGGING,
                 "systemctl": FAKE_SYSTEMCTL}  # fmt: skip
        for name, text in fakes.items():
            (bin_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        (self.imds / "placement").mkdir(parents=True)
        (self.imds / "autoscaling").mkdir()
        (self.imds / "placement" / "region").write_text("eu-central-1")
        (self.imds / "instance-id").write_text("i-0123")
        self.env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "IMDS": "http://169.254.169.254",
            "GPUROUTE": str(bin_dir / "gpuroute"),
            "STATE_FILE": str(root / "run" / "state"),
            "LIFECYCLE_HOOK": "gpuroute-drain",
            "FAKE_IMDS": str(self.imds),
            "FAKE_LOG": str(self.log),
            "FAKE_FAILS": "no-such-call",
            "FAKE_AGENT_RUN": str(root / "agent-run"),
            "AGENTS": " ".join(map(str, agents)),
        }
        (root / "agent-run").mkdir()
        for index in agents:
            self.agent_restarted(index)

    def agent_restarted(self, index: int = 0) -> None:
        """systemd ran one agent's unit again (a new InvocationID)."""
        run = self.root / "agent-run" / f"gpuroute-agent@{index}"
        count = int(run.read_text().split("-")[-1]) + 1 if run.exists() else 1
        run.write_text(f"run-{count}")

    def poll(self, state: str | None, fails: str = "no-such-call") -> list[str]:
        """One poll with IMDS answering `state` (None: no answer); the calls it made."""
        target = self.imds / "autoscaling" / "target-lifecycle-state"
        if state is None:
            target.unlink(missing_ok=True)
        else:
            target.write_text(state)
        self.log.write_text("")
        env = {**self.env, "FAKE_FAILS": fails}
        done = subprocess.run(
            ["bash", str(WATCHER), "--once"], env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return self.log.read_text().splitlines()


@pytest.fixture
def host(tmp_path) -> Host:
    return Host(tmp_path)


def agents(action: str, indexes: tuple[int, ...] = (0, 1)) -> list[str]:
    """The calls that tell each agent of the host (its own config) to do this."""
    return [f"gpuroute agent {action} --config /etc/gpuroute/agent-{i}.toml" for i in indexes]


def test_a_warm_host_stands_by_then_serves(host) -> None:
    assert host.poll(None) == []  # not in a group yet
    assert host.poll("Warmed:Pending") == []
    assert host.poll("Warmed:Running") == agents("standby")  # every engine's agent
    assert host.poll("Warmed:Running") == []  # each state once
    assert host.poll("InService") == agents("activate")
    assert host.poll("InService") == []


def test_a_host_with_one_engine_drives_its_one_agent(tmp_path) -> None:
    host = Host(tmp_path, agents=(0,))
    assert host.poll("Warmed:Running") == agents("standby", (0,))
    assert host.poll("InService") == agents("activate", (0,))


def test_a_restarted_agent_is_told_its_state_again(host) -> None:
    """An agent keeps standby in memory, and comes back active from its config; a host
    still in the warm pool must not serve. A leaving host is not drained twice."""
    assert host.poll("Warmed:Running") == agents("standby")
    host.agent_restarted(1)
    assert host.poll("Warmed:Running") == agents("standby")
    assert host.poll("Warmed:Running") == []
    assert host.poll("InService") == agents("activate")
    host.agent_restarted(0)
    assert host.poll("InService") == agents("activate")
    host.poll("Terminated")
    host.agent_restarted(0)
    assert host.poll("Terminated") == []


@pytest.mark.parametrize("fails", ["standby", "/etc/gpuroute/agent-1.toml"])
def test_a_failed_action_is_tried_again(host, fails) -> None:
    """An agent may not listen yet when the host boots into the warm pool (every agent's
    action fails, or one agent's): the host is in standby only once every agent is."""
    assert host.poll("Warmed:Running", fails=fails) == agents("standby")
    assert host.poll("Warmed:Running") == agents("standby")
    assert host.poll("Warmed:Running") == []


def test_a_leaving_host_drains_every_agent_then_completes_the_hook(host) -> None:
    host.poll("InService")
    calls = host.poll("Terminated")
    assert sorted(calls[:2]) == agents("drain")  # all at once: in any order
    calls = calls[1:]
    assert calls[1].startswith("aws ec2 describe-tags --region eu-central-1 ")
    assert "Name=resource-id,Values=i-0123 Name=key,Values=aws:autoscaling:groupName" in calls[1]
    assert calls[2:] == [
        "aws autoscaling complete-lifecycle-action --region eu-central-1"
        " --lifecycle-action-result CONTINUE --lifecycle-hook-name gpuroute-drain"
        " --auto-scaling-group-name gpuroute-eu-west-l4-1-20260101 --instance-id i-0123"
    ]
    assert host.poll("Terminated") == []


def test_a_failed_drain_still_lets_the_host_go(host) -> None:
    """Stopping an agent drains it again (SIGTERM); holding the host changes nothing."""
    calls = host.poll("Terminated", fails="drain")
    assert sorted(calls[:2]) == agents("drain")
    assert calls[-1].startswith("aws autoscaling complete-lifecycle-action ")


def test_an_unfinished_hook_is_completed_at_the_next_poll(host) -> None:
    calls = host.poll("Terminated", fails="complete-lifecycle-action")
    assert calls[-1].startswith("aws autoscaling complete-lifecycle-action ")
    again = host.poll("Terminated")
    assert sorted(again[:2]) == agents("drain")  # already drained: returns at once
    assert again[-1].startswith("aws autoscaling complete-lifecycle-action ")
    assert host.poll("Terminated") == []
