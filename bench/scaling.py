"""`gpuroute bench overhead --workers N`: what N router workers give over one, and what
sharing their view costs.

This machine has two cores and the engine and wrk need one of them, so N workers cannot be
given N idle cores here. What is measured instead, alternating 1 and N workers for several
rounds (medians): throughput, the cores the router's processes used, and requests per
router core-second (efficiency). N workers on N free cores then serve N × (their efficiency
÷ one worker's) as much. The board the workers share costs each of them one exchange per
`share_interval_s`; it is timed here for 2 and 16 workers, against the Redis board."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import msgpack
import redis.asyncio as aioredis
from gpuroute.bench.process_stats import cpu_seconds
from gpuroute.bench.targets import BenchError, start_router
from gpuroute.bench.wrk import ENGINE_CPU, wrk
from gpuroute.router.config.router import WorkersConfig
from gpuroute.router.shared.load import LoadBoard, RedisBoard
from gpuroute.router.workers.board import MemoryBoard, create_board
from gpuroute.testbed.processes import (
    Child,
    StartError,
    start_engine,
    start_redis,
    wait_http,
)

CONNECTIONS = 32
BACKENDS = 100  # a regional fleet's size for the board's payload
SCALING_COLUMNS = (
    ("workers", "workers", "{}"),
    ("rps", "req/s", "{:,.0f}"),
    ("router_cores", "router CPU", "{:.2f}"),
    ("req_per_core_s", "req/core-s", "{:,.0f}"),
    ("rps_vs_one", "req/s ÷ 1 worker", "{:.2f}"),
    ("efficiency_vs_one", "req/core-s ÷ 1 worker", "{:.2f}"),
    ("projected_vs_one", "on N free cores ÷ 1", "{:.2f}"),
)


def wait_for_workers(child: Child, timeout: float = 120.0) -> None:
    """Until the parent says every worker listens (its one line in the log)."""
    deadline = time.monotonic() + timeout
    while "workers)" not in child.log.read_text(errors="replace"):
        if child.proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"router workers did not start; see {child.log}")
        time.sleep(0.1)  # polling a log file for a line, bounded by the deadline


def measure_workers(url: str, pid: int, duration: float, script: Path) -> dict:
    cpu0 = cpu_seconds(pid)
    result = wrk(url, CONNECTIONS, duration, script)
    cores = (cpu_seconds(pid) - cpu0) / duration
    return {"rps": result["rps"], "router_cores": cores, "req_per_core_s": result["rps"] / cores}


def run_scaling(workdir: Path, script: Path, workers: int, duration: float, rounds: int) -> dict:
    engine = start_engine(
        workdir, 1, "H100", time_scale=0.0001, stream_interval_ms=0, cpu=ENGINE_CPU
    )
    routers: dict[int, Child] = {}
    samples: dict[int, list[dict]] = {1: [], workers: []}
    try:
        wait_http(engine.url + "/health", 30, engine, "fake engine")
        for n in samples:
            routers[n] = start_router(
                workdir, [("H100", engine)], "least_outstanding_work",
                name=f"router-{n}w", workers=n,
            )  # fmt: skip
            wait_http(routers[n].url + "/v1/models", 60, routers[n], f"{n} workers")
            if n > 1:
                wait_for_workers(routers[n])
            wrk(routers[n].url, 4, min(duration, 2.0), script)  # warm pools and caches
        for _ in range(rounds):
            for n, child in routers.items():
                samples[n].append(measure_workers(child.url, child.proc.pid, duration, script))
    finally:
        for child in routers.values():
            child.stop()
        engine.stop()
    return {"rows": scaling_rows(samples), "board": board_costs(workdir)}


def scaling_rows(samples: dict[int, list[dict]]) -> list[dict]:
    rows = []
    for n, runs in samples.items():
        row: dict = {"workers": n, "rounds": len(runs)}
        for key in ("rps", "router_cores", "req_per_core_s"):
            row[key] = round(statistics.median(r[key] for r in runs), 3)
        rows.append(row)
    one = rows[0]
    for row in rows:
        row["rps_vs_one"] = round(row["rps"] / one["rps"], 3)
        row["efficiency_vs_one"] = round(row["req_per_core_s"] / one["req_per_core_s"], 3)
        row["projected_vs_one"] = round(row["workers"] * row["efficiency_vs_one"], 3)
    return rows


def _payload() -> bytes:
    return msgpack.packb({f"10.0.{i // 250}.{i % 250}:8000": 1.234 for i in range(BACKENDS)})


async def time_exchange(boards: list[LoadBoard], calls: int) -> float:
    """Median µs of the first board's exchange once every board has published."""
    payload = _payload()
    for board in boards:
        await board.exchange(payload)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await boards[0].exchange(payload)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def time_memory_board(path: Path, workers: int) -> float:
    create_board(path, workers)
    boards = [MemoryBoard(path, i, workers) for i in range(workers)]
    try:
        return asyncio.run(time_exchange(boards, 2000))
    finally:
        for board in boards:
            board.close()


def time_redis_board(port: int, workers: int) -> float:
    async def timed() -> float:
        client = aioredis.Redis(host="127.0.0.1", port=port)
        try:
            boards = [RedisBoard(client, replica_id=f"w{i}") for i in range(workers)]
            return await time_exchange(boards, 300)
        finally:
            await client.aclose()

    return asyncio.run(timed())


def board_costs(workdir: Path) -> dict:
    """One exchange's cost on each board, for 2 and 16 workers (Redis: where redis-server
    is installed), and the share of a core the memory board takes at the default interval."""
    interval = WorkersConfig().share_interval_s
    out: dict = {"backends": BACKENDS, "share_interval_s": interval}
    try:
        redis = start_redis(workdir)
    except StartError:
        redis = None
    try:
        for n in (2, 16):
            memory = time_memory_board(workdir / f"board-{n}", n)
            out[f"memory_{n}_us"] = round(memory, 1)
            out[f"memory_{n}_core_share"] = round(memory * 1e-6 / interval, 5)
            out[f"redis_{n}_us"] = redis and round(time_redis_board(redis.port, n), 1)
    finally:
        if redis is not None:
            redis.stop()
    return out
