"""deploy/observability against Debian's real Prometheus: `promtool check rules`, the rules'
unit tests (each alert fires and clears), and a real Prometheus scraping a demo fleet
(global tier, two regional routers, agents) against which every dashboard query, template
variable and rule is evaluated."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import aiohttp
import pytest
from support import components
from support.live import MODEL
from support.observed_fleet import KEYS, ObservedFleet
from support.paths import REPO

OBSERVABILITY = REPO / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "gpuroute.json"
PROMETHEUS_DIR = OBSERVABILITY / "prometheus"
# What Grafana puts in place of its variables when a panel is drawn (all regions selected).
GRAFANA_VARIABLES = {
    "${datasource}": "",
    "$__rate_interval": "1m",
    "$__interval": "1s",
    "$__range": "5m",
    "$region": ".*",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = components.binary("promtool")
    return subprocess.run(
        [binary, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120
    )


def test_promtool_checks_the_rules():
    done = promtool("check", "rules", "rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 22 rules found" in done.stdout


def test_every_alert_fires_and_clears_in_the_rules_unit_tests():
    rules, tests = (PROMETHEUS_DIR / n for n in ("rules.yml", "rules_test.yml"))
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", rules.read_text(), re.MULTILINE))
    assert len(alerts) == 11
    tested = re.findall(r"alertname: (\w+)\n\s+exp_alerts:", tests.read_text())
    assert set(tested) == alerts  # each has a case where it fires (and others where it must not)
    done = promtool("test", "rules", "rules_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, Grafana's variables replaced."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: an unknown variable in {expr}"
            found.append((panel["title"], expr))
    return found


def test_the_dashboard_uses_its_datasource_variable_everywhere():
    model = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in (p for p in model["panels"] if p["type"] != "row"):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    assert len(dashboard_targets()) == 52


async def post(
    session: aiohttp.ClientSession, url: str, headers: dict, stream: bool, capped: bool = True
) -> int:
    body = {"model": MODEL, "stream": stream,
            "messages": [{"role": "user", "content": "how are the GPUs today?"}]}  # fmt: skip
    if capped:
        body["max_tokens"] = 8
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        await r.read()
        return r.status


async def drive(fleet: ObservedFleet) -> dict[int, int]:
    """66 requests: through the global tier to both regions, 8 at a time (us-east sheds;
    eu-west's engine is dead, the global tier fails over), two bound to Japan, where no
    region of this fleet is; then tenants and SLO classes straight to each router (globex
    past its quota; some of acme's without max_tokens, so that the end settles a charge)."""
    statuses: dict[int, int] = {}
    classes = ("interactive", "standard", "batch")
    async with aiohttp.ClientSession() as session:

        async def one(url: str, headers: dict, stream: bool = False, capped: bool = True) -> None:
            status = await post(session, url, headers, stream, capped)
            statuses[status] = statuses.get(status, 0) + 1

        hints = [{"x-gpuroute-region": r} for r in ("eu-west", "us-east")] * 16
        for batch in range(0, len(hints), 8):
            await asyncio.gather(
                *(one(fleet.global_url, h, True) for h in hints[batch : batch + 8])
            )
        for _ in range(2):
            await one(fleet.global_url, {"x-gpuroute-residency": "jp"})
        for url in fleet.routers.values():
            for i in range(12):
                h = {"x-gpuroute-slo": classes[i % 3], "authorization": f"Bearer {KEYS['acme']}"}
                # uncapped: charged at auth.default_max_tokens, the rest given back
                await one(url, h, stream=i % 2 == 0, capped=i % 4 != 1)
            for _ in range(4):
                await one(url, {"authorization": f"Bearer {KEYS['globex']}"})
    return statuses


@pytest.fixture
def observed_fleet(tmp_path):
    fleet = ObservedFleet(tmp_path, components.consul(), components.binary("prometheus"))
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while (result := condition()) is not True:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {result}")
        time.sleep(0.2)  # polling Prometheus, which scrapes each second


def all_targets_up(fleet: ObservedFleet):
    active = fleet.api("targets")["activeTargets"]
    down = [t["scrapeUrl"] for t in active if t["health"] != "up"]
    return down if down or not active else True


@pytest.mark.slow
def test_every_dashboard_query_returns_data_from_the_demo_fleet(observed_fleet):
    fleet = observed_fleet
    wait_until(lambda: all_targets_up(fleet), 30, "every target up")
    assert len(fleet.api("targets")["activeTargets"]) == 6  # 1 global tier, 2 routers, 3 agents
    statuses = asyncio.run(drive(fleet))
    assert sum(statuses.values()) == 66, statuses
    assert {200, 429, 502}.issubset(statuses) or {200, 429, 503}.issubset(statuses), statuses
    targets = dashboard_targets()

    def empty():
        missing = [(title, e) for title, e in targets if not fleet.query(e)]
        return missing if missing else True

    wait_until(empty, 30, "every dashboard query to return data")
    for name, variable in variables(DASHBOARD).items():
        metric, label = variable
        series = fleet.api("series", **{"match[]": metric})
        assert any(label in s for s in series), f"${name}: no {metric} has {label}"
    for group in fleet.api("rules")["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule


def variables(path) -> dict[str, tuple[str, str]]:
    """The dashboard's query variables: name -> (metric, label) of its label_values()."""
    found = {}
    for variable in json.loads(path.read_text())["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            metric, label = re.fullmatch(r"label_values\((\w+), *(\w+)\)", query).groups()
            found[variable["name"]] = (metric, label)
    return found
