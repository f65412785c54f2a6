"""`gpuroute bench real`: our router and the peer routers in front of two real vLLM servers
(the CPU build, tiny model, prefix caching on), judged by vLLM itself: its own prefix-cache
hit rate (from its counters) and the clients' TTFT.

Workloads (each target gets the same requests, each message started by a salt of its own, so
that no target inherits another's warm cache):
- `prefix`: conversations that share long system prompts (several of our router's prefix
  blocks each), their turns interleaved, as a chat service's traffic is;
- `chat`: unique prompts of lognormal length (no reuse): balance alone.
Both engines run on one core (`taskset`), leaving the other to the proxy and the clients;
every request streams, `concurrency` at a time."""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
from gpuroute.bench.targets import BenchError, start_baseline, start_router
from gpuroute.bench.wrk import ENGINE_CPU, PROXY_CPU
from gpuroute.router.core.policies import resolve_policy_name
from gpuroute.testbed.peer_routers import PEER_ROUTERS
from gpuroute.testbed.processes import Child, wait_http
from gpuroute.testbed.real_vllm import (
    HOW_TO_GET_VLLM,
    SERVED_NAME,
    VllmOptions,
    engine_samples,
    start_vllm,
    vllm_python,
)

from gpuroute.stats import percentile

WORKLOADS = ("prefix", "chat")
OURS = ("default", "round_robin")  # our default policy, and round robin as the floor
REAL_COLUMNS = (
    ("workload", "workload", "{}"),
    ("target", "target", "{}"),
    ("completed", "done", "{:,}"),
    ("failed", "fail", "{:,}"),
    ("prefix_hit_rate", "vLLM prefix hit", "{:.3f}"),
    ("ttft_p50_s", "TTFT p50", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99", "{:.3f}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("engine_share_max", "busiest engine", "{:.2f}"),
)


def requests_for(
    workload: str, rng: random.Random, scale: int, salt: str = ""
) -> list[tuple[str, int]]:
    """(message, max_tokens) in sending order; `scale` multiplies the request count. `salt`
    starts every message: each target gets the same lengths in text no cache has seen."""
    letters = string.ascii_letters
    if workload == "prefix":
        # an odd number of conversations, so that round robin's rotation does not happen
        # to keep each conversation on one engine
        systems = [salt + "".join(rng.choices(letters, k=6144)) for _ in range(7 * scale)]
        out = []
        for _turn in range(8):
            for system in systems:
                question = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(20, 200)))
                out.append((system + " " + question, rng.randint(8, 48)))
        return out
    return [
        (
            salt + "".join(rng.choices(letters, k=int(min(rng.lognormvariate(6.0, 0.8), 6000)))),
            int(min(rng.lognormvariate(3.5, 0.7), 400)),
        )
        for _ in range(36 * scale)
    ]


async def one(s: aiohttp.ClientSession, url: str, model: str, text: str, n: int):
    """(TTFT, ok) of one streamed request; TTFT at the first event that carries text."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": n,
            "stream": True, "ignore_eos": True}  # fmt: skip
    started, ttft = time.perf_counter(), None
    try:
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                await r.read()
                return None, False
            async for line in r.content:
                text_event = line.startswith(b"data: {") and b'"content":"' in line
                if ttft is None and text_event and b'"content":""' not in line:
                    ttft = time.perf_counter() - started
            return ttft, True
    except aiohttp.ClientError:
        return None, False


async def drive(
    url: str,
    model: str,
    reqs: list[tuple[str, int]],
    concurrency: int,
    on_done: Callable[[], object] | None = None,
):
    """Every request, `concurrency` at a time (closed loop), in order; `on_done` hears of
    each one answered."""
    queue = deque(enumerate(reqs))
    results: list[tuple[float | None, bool]] = [(None, False)] * len(reqs)

    async def worker(s: aiohttp.ClientSession) -> None:
        while queue:
            i, (text, n) = queue.popleft()
            results[i] = await one(s, url, model, text, n)
            if on_done is not None:
                on_done()

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return results


@dataclass(frozen=True, slots=True)
class RealRun:
    """What every target's visit shares: the requests' seed and scale, and how many worker
    processes our router runs (`gpuroute router --workers`; on the proxy's one core)."""

    seed: int = 1
    scale: int = 1
    workers: int = 1
    # hears of each target's visit (its label and request count) and may return what hears
    # of each request answered (a progress bar's step)
    on_measure: Callable[[str, int], Callable[[], object] | None] | None = None


def start_target(target: str, engines: list[Child], workdir: Path, workers: int) -> Child:
    """A peer router, or ours (as `bench live` starts it) with `target` as its policy."""
    pairs = [("L4", e) for e in engines]
    if target in PEER_ROUTERS:
        return start_baseline(target, workdir, pairs, cpu=PROXY_CPU)
    policy = resolve_policy_name(target)
    return start_router(workdir, pairs, policy, cpu=PROXY_CPU, model=SERVED_NAME, workers=workers)


def measure(target: str, workload: str, engines, workdir: Path, run: RealRun, salt: str) -> dict:
    reqs = requests_for(workload, random.Random(run.seed), run.scale, salt)
    proxy = start_target(target, engines, workdir, run.workers)
    try:
        wait_http(proxy.url + "/v1/models", 60, proxy, target)
        before = [engine_samples(e.url) for e in engines]
        started = time.perf_counter()
        hear = run.on_measure
        on_done = None if hear is None else hear(f"{workload} {target}", len(reqs))
        results = asyncio.run(drive(proxy.url, SERVED_NAME, reqs, 8, on_done))
        elapsed = time.perf_counter() - started
        after = [engine_samples(e.url) for e in engines]
    finally:
        proxy.stop()
    delta = [{k: a[k] - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)]
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    served = [d["vllm:request_success_total"] for d in delta]
    ttfts = np.array([t for t, ok in results if ok and t is not None])
    return {
        "workload": workload,
        "target": target,
        "completed": sum(ok for _, ok in results),
        "failed": sum(not ok for _, ok in results),
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "throughput_rps": len(ttfts) / elapsed,
        "engine_share_max": max(served) / max(sum(served), 1.0),
    }


def run_real_bench(
    targets: list[str], workloads: list[str], workdir: Path, run: RealRun = RealRun()
) -> dict:
    if vllm_python() is None:
        raise BenchError(HOW_TO_GET_VLLM)
    unknown = [t for t in targets if t not in OURS and t not in PEER_ROUTERS]
    if unknown or any(w not in WORKLOADS for w in workloads):
        known = ", ".join((*OURS, *PEER_ROUTERS))
        raise BenchError(f"targets: {known}; workloads: {', '.join(WORKLOADS)}")
    options = VllmOptions(max_model_len=8192, cpu=ENGINE_CPU)
    engines = [start_vllm(workdir, options) for _ in range(2)]
    rows = []
    try:
        for workload in workloads:
            for target in targets:
                salt = f"{len(rows):04d}|"  # the same requests, in text never cached
                rows.append(measure(target, workload, engines, workdir, run, salt))
    finally:
        for e in engines:
            e.stop()
    model = "tiny llama (random weights), vLLM CPU"
    return {"engines": 2, "model": model, "router_workers": run.workers, "rows": rows}
