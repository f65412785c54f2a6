"""A small demo fleet on loopback, scraped by a real Prometheus (test_observability.py).

Consul; three simulated GPU hosts (fake engines with their node agents, registered in
Consul); region us-east's router finds them through Consul (one request at a time each, no
queue: it sheds); region eu-west's has only dead engines (their breakers open, it retries,
the global tier fails over from it); the global tier in front of both; Prometheus scraping
every tier each second with deploy/observability/prometheus/rules.yml loaded."""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpuroute.testbed.consul_dev import ConsulDev
from gpuroute.testbed.fleet_host import start_fleet_host
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK, ROUTER_ON_LOOPBACK
from gpuroute.testbed.ports import free_port, free_ports
from gpuroute.testbed.processes import Child, spawn, wait_http

from gpuroute.auth import key_digest
from support.live import MODEL
from support.paths import REPO

RULES = REPO / "deploy" / "observability" / "prometheus" / "rules.yml"
KEYS = {"acme": "sk-acme-observed", "globex": "sk-globex-observed"}


def auth_toml() -> str:
    """acme: any SLO class, a token quota (settled on real usage); globex: 2 requests a
    minute (429s)."""
    return (
        "[auth]\nallow_anonymous = true\n"
        f'[[auth.keys]]\nsha256 = "{key_digest(KEYS["acme"])}"\ntenant = "acme"\n'
        'slo_class = "interactive"\ntokens_per_minute = 1000000\n'
        f'[[auth.keys]]\nsha256 = "{key_digest(KEYS["globex"])}"\ntenant = "globex"\n'
        "requests_per_minute = 2\n"
    )


def region_toml(region: str, port: int, report: int) -> str:
    return (
        ROUTER_ON_LOOPBACK + f"tick_s = 0.1\n[listen]\nport = {port}\n"
        f'[region]\nname = "{region}"\nreport_period_s = 0.2\n'
        f"[region.report_listen]\nport = {report}\n"
    )


def us_east_toml(port: int, report: int, consul: str) -> str:
    membership = f'[membership]\nconsul = "{consul}"\nwait_s = 5\nmax_inflight = 1\n'
    admission = "[admission]\nmax_queue = 0\n"
    return region_toml("us-east", port, report) + membership + admission + auth_toml()


def eu_west_toml(port: int, report: int, dead: list[str]) -> str:
    return (
        region_toml("eu-west", port, report)
        + "[retry]\nmax_attempts = 2\n[breaker]\nfailure_threshold = 1\ncooldown_s = 0.5\n"
        # no active checks: traffic finds the dead engines, so the failure panels have data
        + "[health]\ninterval_s = 0\n"
        + auth_toml()
        + "".join(
            f'[[backends]]\nid = "eu-dead-{i}"\nurl = "{url}"\ngpu = "L4"\nmodels = ["{MODEL}"]\n'
            for i, url in enumerate(dead)
        )
    )


def global_toml(port: int, routers: dict[str, tuple[int, int]]) -> str:
    text = (
        GLOBAL_ON_LOOPBACK + f'regions_file = "{REPO / "regions.example.toml"}"\ntick_s = 0.1\n'
        f"[listen]\nport = {port}\n[region_health]\nstale_after_s = 2.0\nup_after_s = 0.5\n"
    )
    for region, (api, report) in routers.items():
        text += f'[[endpoints]]\nregion = "{region}"\nurl = "http://127.0.0.1:{api}"\n'
        text += f'report = "127.0.0.1:{report}"\n'
    return text


def prometheus_yml(targets: dict[str, list[tuple[str, dict]]]) -> str:
    """Scrape every second, evaluate every second; `targets`: job -> [(host:port, labels)]."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": [t], "labels": labels} for t, labels in items],
            }
            for job, items in targets.items()
        ],
    }
    return json.dumps(config)  # JSON is YAML


@dataclass
class ObservedFleet:
    workdir: Path
    consul_binary: Path
    prometheus_binary: str
    children: list[Child] = field(default_factory=list)
    consul: ConsulDev | None = None
    routers: dict[str, str] = field(default_factory=dict)  # region -> URL
    global_url: str = ""
    prometheus_url: str = ""
    targets: dict[str, list[tuple[str, dict]]] = field(default_factory=dict)

    def start(self) -> None:
        self.consul = ConsulDev(self.consul_binary, log_path=self.workdir / "consul.log")
        self.consul.start()
        hosts_child, hosts = start_fleet_host(
            self.workdir, "hosts", 3, "H100,A100,L4", consul=self.consul.address
        )
        self.children.append(hosts_child)
        agents = [(f"127.0.0.1:{h['admin_port']}", {"host": h["id"]}) for h in hosts]
        dead = free_ports(2)  # nothing listens there
        reports = {"us-east": free_port(), "eu-west": free_port()}
        ports = {"us-east": free_port(), "eu-west": free_port()}
        configs = {
            "us-east": us_east_toml(ports["us-east"], reports["us-east"], self.consul.address),
            "eu-west": eu_west_toml(
                ports["eu-west"],
                reports["eu-west"],
                [f"http://127.0.0.1:{p}" for p in dead],
            ),
        }
        for region, text in configs.items():
            self._start_gpuroute(f"router-{region}", ports[region], text, "/readyz")
            self.routers[region] = f"http://127.0.0.1:{ports[region]}"
        port = free_port()
        routers = {r: (ports[r], reports[r]) for r in ports}
        self._start_gpuroute("global", port, global_toml(port, routers), "/readyz")
        self.global_url = f"http://127.0.0.1:{port}"
        self.targets = {
            "gpuroute-global": [(f"127.0.0.1:{port}", {})],
            "gpuroute-router": [(f"127.0.0.1:{ports[r]}", {"region": r}) for r in ports],
            "gpuroute-agent": agents,
        }
        self._start_prometheus()

    def _start_gpuroute(self, name: str, port: int, config: str, ready: str) -> None:
        (self.workdir / f"{name}.toml").write_text(config)
        command = "global" if name == "global" else "router"
        cmd = [sys.executable, "-m", "gpuroute.cli", command, "--config", f"{name}.toml"]
        child = spawn(name, cmd, self.workdir, port)
        self.children.append(child)
        wait_http(f"http://127.0.0.1:{port}{ready}", 60, child, name)

    def _start_prometheus(self) -> None:
        port = free_port()
        config = self.workdir / "prometheus.yml"
        config.write_text(prometheus_yml(self.targets))
        cmd = [
            self.prometheus_binary, f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]  # fmt: skip
        child = spawn("prometheus", cmd, self.workdir, port)
        self.children.append(child)
        self.prometheus_url = f"http://127.0.0.1:{port}"
        wait_http(self.prometheus_url + "/-/ready", 30, child, "prometheus")

    def api(self, path: str, **params: str) -> dict:
        """One call to Prometheus' HTTP API; its `data`."""
        query = urllib.parse.urlencode(params)
        url = f"{self.prometheus_url}/api/v1/{path}?{query}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr, time=str(time.time()))["result"]

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        if self.consul is not None:
            self.consul.stop()
