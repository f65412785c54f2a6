"""`gpuroute bench overhead`: what a proxy adds to tiny non-streamed requests.

wrk drives the same fake engine directly and through each proxy, at 1 connection (added
latency) and 32 connections (throughput), visiting the targets in turn for several rounds and
keeping medians. The engine and wrk share CPU 0; the proxy under
test gets CPU 1 alone, so "throughput on one core" means what it says. The engine's model
time is scaled to nothing (`--time-scale 0.0001`) so the proxies, not the GPU, are measured.

Our router runs four ways in the same rounds: as configured by default (`gpuroute`: the
access log on, sampled above 50 lines a second; no tracing), with tracing and logging both
off (`gpuroute-quiet`), with both on for every request (`gpuroute-observed`: every span
exported over OTLP to a counting sink on the engine's core, an access line for each
request), and as a busy fleet would run them (`gpuroute-sampled`: 1 trace in 10, the access
log as by default), so that what tracing plus logging cost the request path is read off
one run."""

from __future__ import annotations

import itertools
import json
import os
import re
import ssl
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from gpuroute.bench.process_stats import cpu_seconds
from gpuroute.bench.scaling import run_scaling
from gpuroute.bench.targets import BASELINES, BenchError, start_baseline, start_router
from gpuroute.bench.wrk import ENGINE_CPU, PROXY_CPU, WRK_SCRIPT, wrk
from gpuroute.testbed.certs import LocalCA
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, require, spawn, start_engine, wait_http
from rich.console import Console

CONNECTIONS = (1, 32)
OVERHEAD_COLUMNS = (
    ("target", "target", "{}"),
    ("connections", "conns", "{}"),
    ("rps", "req/s", "{:,.0f}"),
    ("p50_ms", "p50 ms", "{:.3f}"),
    ("p99_ms", "p99 ms", "{:.3f}"),
    ("added_p50_ms", "+p50 ms", "{:.3f}"),
    ("added_p99_ms", "+p99 ms", "{:.3f}"),
    ("rps_vs_haproxy", "req/s ÷ haproxy", "{:.2f}"),
    ("proxy_cores", "proxy cores", "{:.2f}"),
    ("rps_per_core", "req/core-s", "{:,.0f}"),
    ("per_core_vs_haproxy", "req/core-s ÷ haproxy", "{:.2f}"),
)
# tracing and the access log off, and both on for every request (bench docstring)
QUIET = "[access_log]\nenabled = false\n"
TRACED = '[tracing]\notlp_endpoint = "{sink}/v1/traces"\nsample_ratio = {ratio}\n'
EVERY_LINE = "[access_log]\nenabled = true\nsample_above_rps = 1000000000\n"
ACCESS_LINE = re.compile(r'"logger":\s*"gpuroute\.access"')  # a JSON access-log line
ROUTER_TARGETS = (
    "gpuroute", "gpuroute-quiet", "gpuroute-observed", "gpuroute-sampled", "gpuroute-other",
)  # fmt: skip
OBSERVED = ("gpuroute-observed", "gpuroute-sampled")  # each against gpuroute-quiet


def measured(
    url: str, proxy: Child | None, connections: int, duration: float, script: Path
) -> dict[str, float]:
    """One wrk run, with the cores the proxy (its process tree) used meanwhile: requests
    per proxy core-second compare proxies even when the engine's core is what saturates."""
    before = cpu_seconds(proxy.proc.pid) if proxy else 0.0
    result = wrk(url, connections, duration, script)
    if proxy is not None:
        result["proxy_cores"] = (cpu_seconds(proxy.proc.pid) - before) / duration
    return result


def run_overhead(
    duration: float, console: Console, rounds: int = 3, tls: bool = False, workers: int = 0,
    other_python: Path | None = None,
) -> dict:  # fmt: skip
    """All proxies start once; wrk visits them in turn, `rounds` times, and the median of
    each measure is kept: the machine's noise then hits every target alike. With `tls`,
    gpuroute also runs behind a TLS listener (target gpuroute-tls); with `other_python`,
    the router that interpreter imports runs too (target gpuroute-other)."""
    require("taskset")
    with tempfile.TemporaryDirectory(prefix="gpuroute-overhead-") as tmp:
        workdir = Path(tmp)
        script = workdir / "post.lua"
        script.write_text(WRK_SCRIPT)
        engine = start_engine(
            workdir, 0, "H100", time_scale=0.0001, stream_interval_ms=0, cpu=ENGINE_CPU
        )
        sinks = {name: start_sink(workdir, name) for name in OBSERVED}
        proxies: dict[str, Child] = {}
        try:
            wait_http(engine.url + "/health", 30, engine, "fake engine")
            for sink in sinks.values():
                wait_http(sink.url + "/count", 30, sink, "OTLP sink")
            ca = LocalCA(workdir) if tls else None
            urls = {name: sink.url for name, sink in sinks.items()}
            proxies = start_proxies(workdir, engine, ca, other_python, urls)
            samples = visit_targets(engine, proxies, ca, rounds, duration, script, console)
            observed = {name: observability_done(sinks[name], proxies[name]) for name in OBSERVED}
        finally:
            for child in (*proxies.values(), *sinks.values(), engine):
                child.stop()
        scaling = None
        if workers > 1:
            console.print(f"scaling: 1 and {workers} workers, {rounds} rounds")
            scaling = run_scaling(workdir, script, workers, duration, rounds)
    return {
        "scaling": scaling,
        "duration_s": duration,
        "rounds": rounds,
        "engine_cpu": ENGINE_CPU,
        "proxy_cpu": PROXY_CPU,
        "observed": observed,
        "rows": (rows := overhead_rows(samples)),
        "observability_cost": observability_cost(rows),
    }


def visit_targets(
    engine: Child, proxies: dict[str, Child], ca: LocalCA | None, rounds: int,
    duration: float, script: Path, console: Console,
) -> dict[tuple[str, int], list[dict[str, float]]]:  # fmt: skip
    """wrk's runs: each target at each connection count, in turn, `rounds` times (whichever
    router is visited first after a pause comes out a few per cent behind, so each round
    starts with the next target)."""
    urls = {"direct": engine.url} | {name: p.url for name, p in proxies.items()}
    if ca is not None:
        urls["gpuroute-tls"] = urls["gpuroute-tls"].replace("http://", "https://")
    trusting = ssl.create_default_context(cafile=str(ca.ca_file)) if ca else None
    for name, child in proxies.items():
        context = trusting if name == "gpuroute-tls" else None
        wait_http(urls[name] + "/v1/models", 30, child, name, context)
    for url in urls.values():
        wrk(url, 4, min(duration, 2.0), script)  # warm connections and caches
    samples: dict[tuple[str, int], list[dict[str, float]]] = {}
    order = list(urls.items())
    for round_ in range(rounds):
        turn = order[round_ % len(order) :] + order[: round_ % len(order)]
        if round_ % 2:  # a before/after: the two routers take turns at going first
            turn = swapped(turn, "gpuroute", "gpuroute-other")
        for connections in CONNECTIONS:
            for target, url in turn:  # each round starts one further on: no target always first
                console.print(f"round {round_ + 1}/{rounds}: {target}, {connections} connection(s)")
                result = measured(url, proxies.get(target), connections, duration, script)
                samples.setdefault((target, connections), []).append(result)
    return samples


def swapped(turn: list[tuple[str, str]], one: str, other: str) -> list[tuple[str, str]]:
    """`turn` with the places of targets `one` and `other` exchanged (as it is without both)."""
    names = [name for name, _ in turn]
    if one not in names or other not in names:
        return turn
    i, j = names.index(one), names.index(other)
    turn = list(turn)
    turn[i], turn[j] = turn[j], turn[i]
    return turn


def start_sink(workdir: Path, target: str) -> Child:
    """The OTLP endpoint gpuroute-observed exports to, on the engine's core (a Collector's
    work is not the router's)."""
    port = free_port()
    cmd = [sys.executable, "-m", "gpuroute.testbed.otlp_sink", "--port", str(port)]
    return spawn(f"otlp-sink-{target}", cmd, workdir, port, cpu=ENGINE_CPU)


def observability_done(sink: Child, router: Child) -> dict[str, int]:
    """What a traced router produced (its spans flushed at its exit, each router to a sink
    of its own): the proof that tracing and logging were on while it was measured."""
    router.stop()
    with urllib.request.urlopen(sink.url + "/count", timeout=10) as answer:
        received = json.load(answer)
    lines = router.log.read_text(errors="replace").splitlines()
    access = sum(1 for line in lines if ACCESS_LINE.search(line))
    return {"spans": received["spans"], "exports": received["exports"], "access_lines": access}


def start_proxies(
    workdir: Path,
    engine: Child,
    ca: LocalCA | None,
    other_python: Path | None,
    sinks: dict[str, str],
) -> dict[str, Child]:
    """Ours four ways (bench docstring; also behind TLS, given a CA; another version of
    ours, given its interpreter) and the baselines, each on the proxy core."""
    pairs, proxies = [("H100", engine)], {}
    if other_python is not None and not os.access(other_python, os.X_OK):
        raise BenchError(f"--router-python {other_python}: not an executable interpreter")
    policy = "least_outstanding_work"
    proxies["gpuroute"] = start_router(workdir, pairs, policy, cpu=PROXY_CPU)
    observed = {
        "quiet": QUIET,
        "observed": TRACED.format(sink=sinks["gpuroute-observed"], ratio=1.0) + EVERY_LINE,
        "sampled": TRACED.format(sink=sinks["gpuroute-sampled"], ratio=0.1),
    }
    for name, extra in observed.items():
        proxies[f"gpuroute-{name}"] = start_router(
            workdir, pairs, policy, extra=extra, cpu=PROXY_CPU, name=f"router-{name}"
        )
    if other_python is not None:
        proxies["gpuroute-other"] = start_router(
            workdir, pairs, policy, cpu=PROXY_CPU, name="router-other", python=str(other_python)
        )
    if ca is not None:
        cert, key = ca.issue("gpuroute-tls")
        listener = f'[listen.tls]\ncert_file = "{cert}"\nkey_file = "{key}"'
        proxies["gpuroute-tls"] = start_router(
            workdir, pairs, policy, extra=listener, cpu=PROXY_CPU, name="router-tls"
        )
    for name in BASELINES:
        proxies[name] = start_baseline(name, workdir, pairs, cpu=PROXY_CPU)
    return proxies


def overhead_rows(samples: dict[tuple[str, int], list[dict[str, float]]]) -> list[dict]:
    """Medians per target and connection count, with what each adds over `direct` and its
    throughput against HAProxy's (measured in the same rounds)."""
    rows = []
    for (target, connections), runs in samples.items():
        row = {"target": target, "connections": connections, "rounds": len(runs)}
        for key in ("rps", "p50_ms", "p99_ms", "proxy_cores"):
            if key in runs[0]:
                row[key] = round(statistics.median(r[key] for r in runs), 4)
        if row.get("proxy_cores"):
            row["rps_per_core"] = round(row["rps"] / row["proxy_cores"], 1)
        row["non_2xx"] = sum(int(r["non_2xx"]) for r in runs)
        rows.append(row)
    direct = {r["connections"]: r for r in rows if r["target"] == "direct"}
    haproxy = {r["connections"]: r for r in rows if r["target"] == "haproxy"}
    for row in rows:
        base = direct[row["connections"]]
        row["added_p50_ms"] = round(row["p50_ms"] - base["p50_ms"], 4)
        row["added_p99_ms"] = round(row["p99_ms"] - base["p99_ms"], 4)
        peer = haproxy[row["connections"]]
        row["rps_vs_haproxy"] = round(row["rps"] / peer["rps"], 3)
        if "rps_per_core" in row:
            row["per_core_vs_haproxy"] = round(row["rps_per_core"] / peer["rps_per_core"], 3)
    order = ("direct", *ROUTER_TARGETS, "gpuroute-tls", *BASELINES)
    rows.sort(key=lambda r: (order.index(r["target"]), r["connections"]))
    return rows


def observability_cost(rows: list[dict]) -> list[dict]:
    """Tracing plus logging on (every request, and sampled) against both off, per
    connection count, from the same rounds: throughput and throughput per proxy core as
    ratios, latency as what it adds."""
    by = {(r["target"], r["connections"]): r for r in rows}
    cost = []
    for target, connections in itertools.product(OBSERVED, CONNECTIONS):
        on, off = by[(target, connections)], by[("gpuroute-quiet", connections)]
        row = {
            "target": target,
            "connections": connections,
            "rps_on_vs_off": round(on["rps"] / off["rps"], 3),
            "added_p50_ms": round(on["p50_ms"] - off["p50_ms"], 4),
            "added_p99_ms": round(on["p99_ms"] - off["p99_ms"], 4),
        }
        if on.get("rps_per_core") and off.get("rps_per_core"):
            row["per_core_on_vs_off"] = round(on["rps_per_core"] / off["rps_per_core"], 3)
        cost.append(row)
    return cost


COST_COLUMNS = (
    ("target", "on", "{}"),
    ("connections", "conns", "{}"),
    ("rps_on_vs_off", "req/s on ÷ off", "{:.3f}"),
    ("per_core_on_vs_off", "req/core-s on ÷ off", "{:.3f}"),
    ("added_p50_ms", "+p50 ms", "{:.3f}"),
    ("added_p99_ms", "+p99 ms", "{:.3f}"),
)
