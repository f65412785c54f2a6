"""Targets of the live benchmarks: our router, HAProxy and NGINX in front of fake engines.

Each is a real child process on a free loopback port, configured into a scratch folder,
started and stopped the same way, so every target faces identical engines."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuroute.testbed.loopback import ROUTER_ON_LOOPBACK, TESTBED_ROUTER
from gpuroute.testbed.peer_routers import (
    HOW_TO_GET_PEER_ROUTERS,
    PEER_ROUTERS,
    peer_router_command,
    peer_routers_bin,
)
from gpuroute.testbed.ports import free_port, free_ports
from gpuroute.testbed.processes import Child, StartError, require, spawn

BASELINES = ("haproxy", "nginx")
# Optional: HAProxy leastconn with per-server weights from GPU capacity (conns ÷ weight),
# what a careful operator would configure; the simulator's least_connections models it.
# Then the peer routers (testbed/peer_routers.py), installed by `make peer-routers`.
EXTRA_BASELINES = ("haproxy-weighted", *PEER_ROUTERS)


class BenchError(StartError):
    """A benchmark cannot run (bad arguments, a target that would not start)."""


def router_config(
    engines: list[tuple[str, Child]],
    port: int,
    policy: str,
    extra: str = "",
    max_inflight: dict[str, int] | None = None,
    model: str = "llama-3.1-8b",
    workers: int = 1,
) -> str:
    """`max_inflight`: per GPU type, the requests one router lets each engine hold before it
    queues the rest itself (the router's default, 256, otherwise); `model`: what the
    engines serve (the fake engine's default, or a real engine's served name); `workers`:
    processes (their admin listener then gets a port of its own)."""
    # The baselines wait 900 s for a backend; so do we (long non-streamed answers on slow
    # engines at a time scale can exceed the router's 120 s default before their first byte).
    head = ROUTER_ON_LOOPBACK
    if workers > 1:  # several workers answer for admin on a listener of its own
        head = TESTBED_ROUTER
        extra += f"\n[workers]\ncount = {workers}\n[admin_listen]\nport = {free_port()}\n"
    lines = [head + f'policy = "{policy}"', extra, "[listen]", f"port = {port}"]
    # one load generator on one address opens as many connections as it has requests out
    lines += ["[limits]", "first_byte_timeout_s = 900.0", "max_connections_per_ip = 65536"]
    for gpu, child in engines:
        lines += [
            "[[backends]]",
            f'url = "{child.url}"',
            f'gpu = "{gpu}"',
            f'models = ["{model}"]',
        ]
        if max_inflight and gpu in max_inflight:
            lines.append(f"max_inflight = {max_inflight[gpu]}")
    return "\n".join(lines) + "\n"


def start_router(
    workdir: Path,
    engines: list[tuple[str, Child]],
    policy: str,
    *,
    extra: str = "",
    cpu=None,
    name: str | None = None,
    max_inflight: dict[str, int] | None = None,
    model: str = "llama-3.1-8b",
    workers: int = 1,
    python: str = sys.executable,
) -> Child:
    """`python`: the interpreter whose gpuroute runs (another checkout's, to compare)."""
    port = free_port()
    name = name or f"router-{policy}"
    path = workdir / f"{name}.toml"
    path.write_text(router_config(engines, port, policy, extra, max_inflight, model, workers))
    cmd = [python, "-m", "gpuroute.cli", "router", "--config", str(path)]
    return spawn(name, cmd, workdir, port, cpu=cpu)


def haproxy_config(engines: list[tuple[str, Child]], port: int, weighted: bool = False) -> str:
    weights = [""] * len(engines)
    if weighted:
        from gpuroute.router.backends.priors import engine_priors

        priors = engine_priors("llama-3.1-8b")
        weights = [f" weight {max(1, round(256 * priors[gpu].capacity))}" for gpu, _ in engines]
    servers = "\n".join(
        f"    server e{i} 127.0.0.1:{child.port}{weights[i]}"
        for i, (_, child) in enumerate(engines)
    )
    return f"""global
    maxconn 8000
    nbthread 1

defaults
    mode http
    timeout connect 2s
    timeout client 900s
    timeout server 900s
    option http-no-delay
    retries 3
    option redispatch

frontend fe
    bind 127.0.0.1:{port}
    default_backend engines

backend engines
    balance leastconn
{servers}
"""


def nginx_config(engines: list[tuple[str, Child]], port: int, workdir: Path) -> str:
    servers = "\n".join(f"        server 127.0.0.1:{child.port};" for _, child in engines)
    return f"""worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 8000; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/nginx-body;
    proxy_temp_path {workdir}/nginx-proxy;
    fastcgi_temp_path {workdir}/nginx-fastcgi;
    uwsgi_temp_path {workdir}/nginx-uwsgi;
    scgi_temp_path {workdir}/nginx-scgi;
    upstream engines {{
        least_conn;
{servers}
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 64m;
        location / {{
            proxy_pass http://engines;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 900s;
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""


def start_baseline(
    name: str, workdir: Path, engines: list[tuple[str, Child]], *, cpu=None
) -> Child:
    port = free_port()
    if name in ("haproxy", "haproxy-weighted"):
        path = workdir / f"{name}.cfg"
        path.write_text(haproxy_config(engines, port, weighted=name == "haproxy-weighted"))
        return spawn(
            "haproxy", [require("haproxy"), "-f", str(path), "-db"], workdir, port, cpu=cpu
        )
    if name == "nginx":
        path = workdir / "nginx.conf"
        path.write_text(nginx_config(engines, port, workdir))
        cmd = [require("nginx"), "-c", str(path), "-p", str(workdir)]
        return spawn("nginx", cmd, workdir, port, cpu=cpu)
    if name in PEER_ROUTERS:
        bin_dir = peer_routers_bin()
        if bin_dir is None:
            raise BenchError(HOW_TO_GET_PEER_ROUTERS)
        port, metrics_port = free_ports(2)
        urls = [child.url for _, child in engines]
        cmd = peer_router_command(name, urls, port, metrics_port, bin_dir)
        return spawn(name, cmd, workdir, port, cpu=cpu)
    known = ", ".join(BASELINES + EXTRA_BASELINES)
    raise BenchError(f"unknown baseline {name!r}; known: {known}")
