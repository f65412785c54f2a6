"""`gpuroute bench stream`: how many token events each proxy relays per core, and what it
adds between tokens.

One fake engine sends one token per SSE event, `--token-interval-ms` apart, its model time
scaled to nothing; N streams (1, 100, 1,000 by default) run directly and through each proxy
in turn. The engine and this load generator share CPU 0; the proxy under test has CPU 1 to
itself. Its CPU time over the run gives events relayed per proxy core-second, the measure
that does not depend on how fast the generator could push; its resident memory while every
stream is open gives memory per stream. Latencies are compared with the direct run at the
same N, so what the machine adds to every target cancels out."""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
from pathlib import Path

from gpuroute.bench.process_stats import cpu_seconds, rss_kib
from gpuroute.bench.stream_client import StreamsResult, run_streams
from gpuroute.bench.targets import start_baseline, start_router
from gpuroute.bench.wrk import ENGINE_CPU, PROXY_CPU
from gpuroute.testbed.processes import Child, require, start_engine, wait_http

from gpuroute.stats import percentile

MODEL = "llama-3.1-8b"
# Before each measured visit, a few short streams through the same target: every target
# then starts its run warm (caches, pools, the collector's generations), not only the one
# that happened to run just before it in the rotation.
WARM_STREAMS, WARM_TOKENS = 100, 4
STREAM_COLUMNS = (
    ("target", "target", "{}"),
    ("streams", "streams", "{:,}"),
    ("failed", "failed", "{}"),
    ("events_per_s", "events/s", "{:,.0f}"),
    ("proxy_cores", "proxy CPU", "{:.2f}"),
    ("events_per_core_s", "events/core-s", "{:,.0f}"),
    ("vs_smg", "÷ SMG", "{:.2f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.2f}"),
    ("itl_p99_ms", "ITL p99 ms", "{:.2f}"),
    ("added_itl_p99_ms", "+ITL p99 ms", "{:.2f}"),
    ("added_ttft_p50_ms", "+TTFT p50 ms", "{:.2f}"),
    ("kib_per_stream", "KiB/stream", "{:.1f}"),
)


async def measure(
    target: str, port: int, pid: int | None, streams: int, tokens: int, interval_s: float
) -> dict:
    """One run: the streams, the proxy's CPU over them and its memory half way through."""
    idle = rss_kib(pid) if pid else 0
    cpu0 = cpu_seconds(pid) if pid else 0.0
    busy: list[int] = []
    loop = asyncio.get_running_loop()
    halfway = interval_s * (1 + tokens / 2)
    if pid:
        loop.call_later(halfway, lambda: busy.append(rss_kib(pid)))
    result = await run_streams(
        port, streams, tokens, interval_s, stream_timeout(interval_s, tokens), MODEL
    )
    cpu = (cpu_seconds(pid) - cpu0) if pid else 0.0
    return _row(target, result, cpu, idle, busy[0] if busy else idle)


def stream_timeout(interval_s: float, tokens: int) -> float:
    """How long a run may take: three times its paced length, plus start-up."""
    return interval_s * (tokens + 1) * 3 + 30


async def warm(port: int, streams: int, interval_s: float) -> None:
    timeout = stream_timeout(interval_s, WARM_TOKENS)
    await run_streams(port, min(streams, WARM_STREAMS), WARM_TOKENS, interval_s, timeout, MODEL)


def ms(seconds, q: float) -> float:
    return percentile(seconds, q) * 1e3


def _row(target: str, r: StreamsResult, cpu: float, idle_kib: int, busy_kib: int) -> dict:
    wall = max(r.ended - r.started, 1e-9)
    return {
        "target": target,
        "streams": r.streams,
        "completed": r.completed,
        "failed": r.failed,
        "events": r.events,
        "events_per_s": r.events / wall,
        "proxy_cores": cpu / wall,
        "events_per_core_s": r.events / cpu if cpu > 0 else None,
        "itl_p50_ms": ms(r.gaps_s, 50),
        "itl_p99_ms": ms(r.gaps_s, 99),
        "ttft_p50_ms": ms(r.ttft_s, 50),
        "kib_per_stream": (busy_kib - idle_kib) / r.streams if target != "direct" else None,
    }


def start_proxies(targets: list[str], workdir: Path, engine: Child) -> dict[str, Child]:
    pairs, proxies = [("H100", engine)], {}
    for name in targets:
        if name == "gpuroute":
            proxies[name] = start_router(
                workdir, pairs, "least_outstanding_work", cpu=PROXY_CPU,
                max_inflight={"H100": 1_000_000},
            )  # fmt: skip
        else:
            proxies[name] = start_baseline(name, workdir, pairs, cpu=PROXY_CPU)
    for name, child in proxies.items():
        wait_http(child.url + "/v1/models", 60, child, name)
    return proxies


def run_stream_bench(
    targets: list[str], stream_counts: list[int], tokens: int, interval_ms: float, rounds: int
) -> dict:
    require("taskset")
    interval = interval_ms / 1000
    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuroute-bench-stream-") as tmp:
        workdir = Path(tmp)
        engine = start_engine(workdir, 0, "H100", time_scale=0.0001, stream_interval_ms=0,
                              cpu=ENGINE_CPU, token_interval_ms=interval_ms)  # fmt: skip
        proxies: dict[str, Child] = {}
        affinity = os.sched_getaffinity(0)
        try:
            wait_http(engine.url + "/health", 30, engine, "fake engine")
            proxies = start_proxies(targets, workdir, engine)
            os.sched_setaffinity(0, {ENGINE_CPU})  # the generator shares the engine's core
            ports = {"direct": (engine.port, None)}
            ports |= {name: (c.port, c.proc.pid) for name, c in proxies.items()}
            for _ in range(rounds):
                for n in stream_counts:
                    for target, (port, pid) in ports.items():
                        asyncio.run(warm(port, n, interval))
                        row = asyncio.run(measure(target, port, pid, n, tokens, interval))
                        runs.setdefault((target, n), []).append(row)
        finally:
            os.sched_setaffinity(0, affinity)
            for child in proxies.values():
                child.stop()
            engine.stop()
    rows = stream_rows(runs)
    return {"tokens": tokens, "token_interval_ms": interval_ms, "rounds": rounds, "rows": rows}


def stream_rows(runs: dict[tuple[str, int], list[dict]]) -> list[dict]:
    """Medians over rounds; added latencies against `direct` at the same stream count and
    events per core-second against SMG's (where SMG ran)."""
    rows = []
    for samples in runs.values():
        row = dict(samples[0])
        for key, value in samples[0].items():
            if isinstance(value, float):
                values = [s[key] for s in samples if s[key] is not None]
                row[key] = round(statistics.median(values), 4) if values else None
        row["failed"] = sum(s["failed"] for s in samples)
        # the heap grows in the first round and is reused after: its growth is the cost
        grown = [s["kib_per_stream"] for s in samples if s["kib_per_stream"] is not None]
        row["kib_per_stream"] = round(max(grown), 1) if grown else None
        rows.append(row)
    by = {(r["target"], r["streams"]): r for r in rows}
    for row in rows:
        direct, smg = by[("direct", row["streams"])], by.get(("smg-cache-aware", row["streams"]))
        row["added_itl_p50_ms"] = round(row["itl_p50_ms"] - direct["itl_p50_ms"], 3)
        row["added_itl_p99_ms"] = round(row["itl_p99_ms"] - direct["itl_p99_ms"], 3)
        row["added_ttft_p50_ms"] = round(row["ttft_p50_ms"] - direct["ttft_p50_ms"], 3)
        mine, theirs = row["events_per_core_s"], smg and smg["events_per_core_s"]
        row["vs_smg"] = round(mine / theirs, 3) if mine and theirs else None
    return rows
