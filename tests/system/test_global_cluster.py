"""Three regions, each in its own network namespace with its own Consul datacenter
(WAN-joined), a fake engine, a node agent and a regional router that registers as
gpuroute-router. The global tier, in the root namespace, finds the routers through Consul
(`?dc=`). A whole region is killed and brought back. Security is on throughout: mutual TLS
from the global tier to the routers and their region reports and from routers to agents'
load streams, API keys required, signed residency decisions, and Consul's RPC between
servers over verified TLS with encrypted gossip.

The RTT matrix's delays would be applied with `tc netem`; kernels without sch_netem (this
machine's) run the test without them and say so."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import aiohttp
import pytest
from gpuroute.global_.config import load_global_config
from gpuroute.global_.server import REGION_HEADER, GlobalApp, GlobalServer
from gpuroute.testbed.certs import LocalCA
from gpuroute.testbed.consul_dev import consul_binary
from gpuroute.testbed.loopback import GLOBAL_ON_LOOPBACK
from support.live import MODEL, async_wait_for, chat_body, get_json, holds
from support.netns import Host, NetnsLab

from gpuroute.auth import key_digest

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
REGIONS = {"us-east": "H100", "eu-west": "A100", "ap-northeast": "L4"}
API_KEY, DECISION_KEY = "sk-cluster", "global-signs-with-this"
JURISDICTIONS = {"us-east": "us", "eu-west": "eu", "ap-northeast": "jp"}
CONSUL_TOKEN = "6d0d5a2e-9b1c-4a0e-8a57-3c2f0e6b1d77"  # ACLs on, default deny, one token here
RTT_MS = {
    ("us-east", "eu-west"): 86,
    ("us-east", "ap-northeast"): 140,
    ("eu-west", "ap-northeast"): 228,
}


def apply_rtt(lab: NetnsLab) -> str:
    """Per-destination netem delays (half the RTT each way); returns what was done."""
    for (a, b), rtt in RTT_MS.items():
        for src, dst in ((a, b), (b, a)):
            host, peer = lab.hosts[src], lab.hosts[dst]
            dev, band = host.link + "p", f"1:{10 + list(REGIONS).index(dst)}"
            steps = [
                f"qdisc replace dev {dev} root handle 1: htb default 99",
                f"class replace dev {dev} parent 1: classid 1:99 htb rate 10gbit",
                f"class replace dev {dev} parent 1: classid {band} htb rate 10gbit",
                f"qdisc replace dev {dev} parent {band} netem delay {rtt / 2}ms",
                f"filter replace dev {dev} protocol ip parent 1: prio 1 u32 "
                f"match ip dst {peer.ip}/32 flowid {band}",
            ]
            for step in steps:
                result = subprocess.run(
                    ["ip", "netns", "exec", host.ns, "tc", *step.split()],
                    capture_output=True, text=True,
                )  # fmt: skip
                if result.returncode != 0:
                    return f"no RTT emulation (tc {step.split()[0]} ... {step.split()[-3]}): " + (
                        result.stderr.strip()
                    )
    return "RTT emulated with netem: " + ", ".join(
        f"{a}-{b} {r} ms" for (a, b), r in RTT_MS.items()
    )


def consul_security(lab: NetnsLab, region: str) -> list[str]:
    """Consul's own arguments for security: RPC between the servers over TLS (verified both
    ways, server names checked) with certificates from `consul tls`, and encrypted gossip."""
    tls = lab.workdir / "consul-tls"
    tls.mkdir(exist_ok=True)
    consul = str(consul_binary())
    if not (tls / "consul-agent-ca.pem").exists():
        subprocess.run([consul, "tls", "ca", "create"], cwd=tls, check=True, capture_output=True)
        (tls / "gossip.key").write_text(
            subprocess.run([consul, "keygen"], check=True, capture_output=True, text=True).stdout
        )
    cert = tls / f"{region}-server-consul-0.pem"
    if not cert.exists():
        subprocess.run([consul, "tls", "cert", "create", "-server", "-dc", region],
                       cwd=tls, check=True, capture_output=True)  # fmt: skip
    hcl = (
        f'tls {{ defaults {{ ca_file = "{tls}/consul-agent-ca.pem" cert_file = "{cert}" '
        f'key_file = "{tls}/{region}-server-consul-0-key.pem" verify_incoming = true '
        "verify_outgoing = true } internal_rpc { verify_server_hostname = true } }"
    )
    acl = (
        'primary_datacenter = "us-east"\nacl { enabled = true default_policy = "deny" '
        "enable_token_replication = true tokens { "
        f'initial_management = "{CONSUL_TOKEN}" agent = "{CONSUL_TOKEN}" '
        f'replication = "{CONSUL_TOKEN}" }} }}'
    )
    return ["-hcl", hcl, "-hcl", acl, "-encrypt", (tls / "gossip.key").read_text().strip()]


def start_region(lab: NetnsLab, host: Host, ca: LocalCA) -> None:
    """Consul, a fake engine, an agent and a router, with security on: the agent's load
    stream and the router's API and region reports take only mutual-TLS callers, keys are
    required, and the router serves only requests the global tier signed a decision for."""
    region, gpu = host.name, REGIONS[host.name]
    others = [lab.hosts[r].ip for r in REGIONS if r != region]
    consul = [
        str(consul_binary()), "agent", "-server", "-bootstrap-expect", "1", "-datacenter", region,
        "-node", f"server-{region}", "-bind", host.ip, "-client", f"127.0.0.1 {host.ip}",
        "-data-dir", str(lab.workdir / f"consul-{region}"), "-dns-port", "-1", "-grpc-port", "-1",
        "-log-level", "warn", *[x for ip in others for x in ("-retry-join-wan", ip)],
        *consul_security(lab, region),
    ]  # fmt: skip
    lab.popen(host, consul, f"consul-{region}")
    py = [sys.executable, "-m", "gpuroute.cli"]
    lab.popen(host, [*py, "fake-engine", "--host", "0.0.0.0", "--port", "8000", "--gpu", gpu],
              f"engine-{region}")  # fmt: skip
    agent = lab.workdir / f"agent-{region}.toml"
    agent.write_text(
        f'id = "{region}-gpu-1"\nregion = "{region}"\nadvertise_address = "{host.ip}"\n'
        f'[engine]\nurl = "http://127.0.0.1:8000"\nmodels = ["{MODEL}"]\ngpu = "{gpu}"\n'
        '[telemetry]\nsource = "simulated"\nhealth_interval_s = 0.2\n'
        f'[consul]\naddress = "http://127.0.0.1:8500"\nttl_s = 6\ntoken = "{CONSUL_TOKEN}"\n'
        '[load_stream]\nhost = "0.0.0.0"\nport = 7070\n[admin]\nport = 7071\n'
        f"[load_stream.tls]\n{ca.server_section(f'agent-{region}', (host.ip,))}"
    )
    lab.popen(host, [*py, "agent", "--config", str(agent)], f"agent-{region}")
    router = lab.workdir / f"router-{region}.toml"
    router.write_text(
        f'expose_backend_header = true\ntick_s = 0.05\n[listen]\nhost = "{host.ip}"\nport = 8080\n'
        f"[listen.tls]\n{ca.server_section(f'router-{region}', (host.ip,))}"
        f'[membership]\nconsul = "http://127.0.0.1:8500"\nwait_s = 5\ntoken = "{CONSUL_TOKEN}"\n'
        f"[membership.load_stream_tls]\n{ca.client_section(f'router-{region}-client')}"
        f'[region]\nname = "{region}"\nadvertise_address = "{host.ip}"\nreport_period_s = 0.2\n'
        f'decision_key = "{DECISION_KEY}"\nrequire_global_decision = true\n'
        f'jurisdiction = "{JURISDICTIONS[region]}"\n'
        f'[region.report_listen]\nhost = "{host.ip}"\nport = 7080\n'
        f"[region.report_listen.tls]\n{ca.server_section(f'report-{region}', (host.ip,))}"
        f'[auth]\nrequired = true\n[[auth.keys]]\nsha256 = "{key_digest(API_KEY)}"\n'
        'tenant = "acme"\n'
    )
    lab.popen(host, [*py, "router", "--config", str(router)], f"router-{region}")


async def test_region_outage_across_wan_federated_datacenters(lab, repo) -> None:
    for region in REGIONS:
        lab.add_host(region)
    rtt = apply_rtt(lab)
    ca = LocalCA(lab.workdir)
    for region in REGIONS:
        start_region(lab, lab.hosts[region], ca)
    us = f"http://{lab.hosts['us-east'].ip}:8500"
    await async_wait_for(
        holds(lambda: len(get_json(us + "/v1/catalog/datacenters") or []) == 3), 60, "WAN join"
    )
    (lab.workdir / "regions.toml").write_text((repo / "regions.example.toml").read_text())
    (lab.workdir / "global.toml").write_text(
        GLOBAL_ON_LOOPBACK + 'regions_file = "regions.toml"\ntick_s = 0.05\n[listen]\nport = 0\n'
        "[region_health]\nstale_after_s = 2.0\nup_after_s = 5.0\n"
        f'[discovery]\nconsul = "{us}"\ninterval_s = 0.5\ntoken = "{CONSUL_TOKEN}"\n'
        f"[router_tls]\n{ca.client_section('global-tier')}"
        f"[report_tls]\n{ca.client_section('global-reports')}"
        f'[residency]\ndecision_key = "{DECISION_KEY}"\n'
        f'api_keys = {{ "{key_digest(API_KEY)}" = "acme" }}\n'
    )
    config, fleet, rules = load_global_config(lab.workdir / "global.toml")
    app = GlobalApp(config, fleet, rules)
    transitions: list[tuple[float, str, str]] = []
    feed = app.feeds.feeds["eu-west"]
    why: list[str] = []  # for a failure message: what the region looked like at each change

    def changed(region: str, state: str) -> None:
        transitions.append((time.monotonic(), region, state))
        if region == "eu-west":
            health = feed.health
            why.append(
                f"{state}: failures {health.failures}, routable {feed.routable_backends}, "
                f"last report {health.last_report}"
            )

    app.feeds.on_change = changed
    server = GlobalServer(app)
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    results: list[tuple[float, int, str | None, str]] = []
    stop = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as s:

            async def all_up() -> bool:
                async with s.get(url + "/admin/regions") as r:
                    return {x["state"] for x in (await r.json())["regions"]} == {"up"}

            await async_wait_for(all_up, 90, "three regions up through Consul discovery")

            async def client(kind: str) -> None:
                headers = {REGION_HEADER: "eu-west", "Authorization": f"bearer {API_KEY}"}
                if kind == "eu":
                    headers["x-gpuroute-residency"] = "eu"
                while not stop.is_set():
                    async with s.post(url + "/v1/chat/completions", json=chat_body(),
                                      headers=headers) as r:  # fmt: skip
                        await r.read()
                        results.append(
                            (time.monotonic(), r.status, r.headers.get(REGION_HEADER), kind)
                        )
                    if r.status != 200:
                        await asyncio.sleep(0.05)

            tasks = [asyncio.create_task(client(k)) for k in ("pref", "pref", "pref", "eu")]
            await async_wait_for(holds(lambda: len(results) > 20), 20, "traffic")
            down_at = time.monotonic()
            lab.kill_host(lab.hosts["eu-west"])
            await async_wait_for(
                holds(lambda: any(t > down_at and k == "pref" and st == 200 and r != "eu-west"
                                  for t, st, r, k in results)), 10, "traffic moved",
            )  # fmt: skip
            after = [t for t, st, r, k in results
                     if t > down_at and k == "pref" and st == 200 and r != "eu-west"]  # fmt: skip
            moved = after[0] - down_at
            await asyncio.sleep(1.0)  # the outage goes on under traffic
            back_at = time.monotonic()
            start_region(lab, lab.hosts["eu-west"], ca)
            await async_wait_for(
                holds(lambda: any(t > back_at and r == "eu-west" for t, st, r, k in results)),
                90, "traffic back to eu-west",
            )  # fmt: skip
            returned = (
                next(t for t, st, r, k in results if t > back_at and r == "eu-west") - back_at
            )
            await asyncio.sleep(2.0)  # watch for flapping
            stop.set()
            await asyncio.gather(*tasks)
    finally:
        stop.set()
        # shutdown is bounded (feeds close in 5 s at most): a hang here is a failure
        await asyncio.wait_for(server.drain(timeout=2.0), 60)
    failed = [r for r in results if r[3] == "pref" and r[1] != 200]
    violations = [r for r in results if r[3] == "eu" and r[1] == 200 and r[2] != "eu-west"]
    eu_states = [st for _, r, st in transitions if r == "eu-west"]
    print(
        f"\n{rtt}\nWAN-federated region outage: traffic moved after {moved:.3f} s; back "
        f"{returned:.1f} s after the region restarted (Consul, engine, agent, router); "
        f"{len(results)} requests, {len(failed)} failed, {len(violations)} residency "
        f"violations; eu-west states after start-up {eu_states[1:]}"
    )
    assert moved < 5.0
    assert failed == [] and violations == []
    served_eu = [r for r in results if r[3] == "eu" and r[1] == 200]
    assert served_eu, "EU-bound clients were never served (signed decisions refused?)"
    # A region coming back may fall out of probation while its engine and agent start (its
    # reports say nothing is routable): down and recovering may alternate, but it is up once,
    # at the end, and served nothing before that (hysteresis, not a flap under traffic).
    assert eu_states[0] == "up" and eu_states[1] == "down" and eu_states[-1] == "up", why
    assert eu_states[1:-1] == ["down", "recovering"] * ((len(eu_states) - 2) // 2), why
    up_again = max(t for t, r, st in transitions if r == "eu-west" and st == "up")
    early = [t for t, st, r, k in results if back_at < t < up_again and r == "eu-west"]
    assert early == [], f"eu-west served {len(early)} requests before it was up again"
