"""`gpuroute bench tenants`: does one tenant's burst reach another tenant's latency?

Router replicas share Redis and an API-key table. Tenant `steady` sends synthetic chat at
`steady_utilization` of the fleet's capacity for the whole run; tenant `bursty`, whose quota
is `quota_share` of capacity in requests per minute, sends `burst_utilization` of capacity
during the middle window. Three runs, each on a fresh fleet with the same arrivals:

- `alone`: steady only (the baseline), and `alone again` (the noise between two runs);
- `burst, quota`: steady + bursty under its quota (what the issue asks about);
- `burst, no quota`: the same burst with bursty's quota lifted (what the quota prevents);
- with `--router-queue`, `alone, router queue` and `burst, no quota, router queue`: each
  replica lets an engine hold only its share of what the engine holds near its throughput
  knee, so that any excess waits in the routers' queues, where fair queuing between tenants
  orders it, rather than in the engines' first-come-first-served queues.

Steady's latency for the requests it sent during the burst window, against `alone`, is the
result; bursty's granted requests are compared with what its bucket allows."""

from __future__ import annotations

import asyncio
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuroute.bench.live import LiveBenchSpec, load_workload
from gpuroute.bench.live_stats import MODEL, engine_stats, q
from gpuroute.bench.loadgen import Replay, RequestResult
from gpuroute.bench.targets import start_router
from gpuroute.router.shared.quotas import key_digest
from gpuroute.sim.workloads import synthetic
from gpuroute.testbed.processes import Child, start_engine, start_redis, wait_http

from gpuroute.stats import percentile

STEADY_KEY, BURSTY_KEY = "sk-bench-steady", "sk-bench-bursty"
RUNS = ("alone", "alone again", "burst, quota", "burst, no quota")
ROUTER_QUEUE_RUNS = ("alone, router queue", "burst, no quota, router queue")  # --router-queue


@dataclass(frozen=True)
class TenantsSpec:
    engines: list[str]
    replicas: int = 4
    duration_s: float = 60.0
    burst_from_s: float = 20.0
    burst_to_s: float = 40.0
    steady_utilization: float = 0.5
    burst_utilization: float = 1.0
    quota_share: float = 0.02  # of capacity, as bursty's requests-per-minute quota
    router_queue: bool = False  # add the run with per-engine limits in the routers
    time_scale: float = 2.0
    seed: int = 1


def auth_toml(bursty_rpm: float | None) -> str:
    quota = f"requests_per_minute = {bursty_rpm:.1f}\n" if bursty_rpm else ""
    return (
        "[auth]\nrequired = true\n"
        f'[[auth.keys]]\nsha256 = "{key_digest(STEADY_KEY)}"\ntenant = "steady"\n'
        f'[[auth.keys]]\nsha256 = "{key_digest(BURSTY_KEY)}"\ntenant = "bursty"\n{quota}'
    )


def bearer_header(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def latency(results: list[RequestResult], window: tuple[float, float] | None = None) -> dict:
    chosen = [r for r in results if window is None or window[0] <= r.sent_at < window[1]]
    ok = [r for r in chosen if r.ok]
    ttft, e2e = [r.ttft_s for r in ok], [r.e2e_s for r in ok]
    return {
        "sent": len(chosen),
        "ok": len(ok),
        "refused_429": sum(r.status == 429 for r in chosen),
        "failed_other": sum(not r.ok and r.status != 429 for r in chosen),
        "ttft_p50_s": q(ttft, 50),
        "ttft_p99_s": q(ttft, 99),
        "e2e_p50_s": q(e2e, 50),
        "e2e_p99_s": q(e2e, 99),
    }


# Requests one engine holds at ~90 % of its capacity on synthetic chat with llama-3.1-8b:
# Little's law (arrival rate x mean E2E) per GPU type in `gpuroute sim` on the bench's fleet
# (99.7 / 48.7 / 15.8 at 85 %, 195 / 110 / 37 at 100 %, where TTFT p99 turns up 7x).
KNEE_INFLIGHT = {"H100": 120, "A100": 58, "L4": 19}


def router_queue_limits(spec: TenantsSpec) -> dict[str, int]:
    """Per GPU type, each replica's share of what an engine holds near its throughput knee
    (other types: the H100's figure scaled by their capacity prior)."""
    from gpuroute.router.backends.priors import engine_priors

    priors = engine_priors(MODEL)
    knee = {
        gpu: KNEE_INFLIGHT.get(gpu, KNEE_INFLIGHT["H100"] * priors[gpu].capacity)
        for gpu in set(spec.engines)
    }
    return {gpu: max(1, round(n / spec.replicas)) for gpu, n in knee.items()}


async def _delayed(replay: Replay, delay_s: float) -> list[RequestResult]:
    await asyncio.sleep(delay_s)  # the burst's scheduled start, not a synchronisation
    return await replay.run()


async def one_run(run: str, spec: TenantsSpec, steady, bursty, rpm: float, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    live = LiveBenchSpec(engines=spec.engines, time_scale=spec.time_scale)
    engines = [
        start_engine(folder, i, gpu, time_scale=live.time_scale,
                     stream_interval_ms=live.stream_interval_ms)
        for i, gpu in enumerate(spec.engines)
    ]  # fmt: skip
    children: list[Child] = list(engines)
    try:
        for child in engines:
            wait_http(child.url + "/health", 30, child, child.name)
        redis = start_redis(folder)
        children.append(redis)
        extra = f'[redis]\nurl = "redis://127.0.0.1:{redis.port}/0"\n'
        extra += auth_toml(None if run.startswith("burst, no quota") else rpm)
        limits = router_queue_limits(spec) if run.endswith("router queue") else None
        pairs = list(zip(spec.engines, engines, strict=True))
        urls = []
        for k in range(spec.replicas):
            replica = start_router(folder, pairs, "least_outstanding_work", extra=extra,
                                   name=f"replica-{k}", max_inflight=limits)  # fmt: skip
            children.append(replica)
            wait_http(replica.url + "/healthz", 30, replica, replica.name)
            urls.append(replica.url)
        steady_replay = Replay(
            urls, steady, MODEL, headers={"Authorization": f"Bearer {STEADY_KEY}"}
        )
        tasks = [asyncio.create_task(steady_replay.run())]
        if run.startswith("burst"):
            burst_replay = Replay(
                urls[1:] + urls[:1],
                bursty,
                MODEL,
                headers={"Authorization": f"Bearer {BURSTY_KEY}"},
            )
            tasks.append(asyncio.create_task(_delayed(burst_replay, spec.burst_from_s)))
        outcomes = await asyncio.gather(*tasks)
        window = (spec.burst_from_s, spec.burst_to_s)
        row = {
            "run": run,
            "steady": latency(outcomes[0]),
            "steady_in_burst": latency(outcomes[0], window),
            "_steady": outcomes[0],  # per request, for the paired comparison
        }
        if run.startswith("burst"):
            row["bursty"] = latency(outcomes[1])
        row |= await engine_stats(engines, steady_replay.elapsed())
        return row
    finally:
        for child in children:
            child.stop()


def run_tenants_bench(spec: TenantsSpec, on_run=None) -> dict:
    live = LiveBenchSpec(engines=spec.engines, time_scale=spec.time_scale, seed=spec.seed,
                         duration_s=spec.duration_s, target_utilization=1.0)  # fmt: skip
    _, capacity_rps = load_workload(live)  # wall-clock requests/s at 100 % of capacity
    steady_rate = spec.steady_utilization * capacity_rps
    steady = synthetic("chat", max(1, int(steady_rate * spec.duration_s)), steady_rate, spec.seed)
    burst_s = spec.burst_to_s - spec.burst_from_s
    burst_rate = spec.burst_utilization * capacity_rps
    bursty = synthetic("chat", max(1, int(burst_rate * burst_s)), burst_rate, spec.seed + 1)
    rpm = spec.quota_share * capacity_rps * 60.0
    report: dict = {
        "engines": spec.engines,
        "replicas": spec.replicas,
        "time_scale": spec.time_scale,
        "capacity_rps": round(capacity_rps, 3),
        "steady_rps": round(steady_rate, 3),
        "bursty_rps": round(burst_rate, 3),
        "burst_window_s": [spec.burst_from_s, spec.burst_to_s],
        "bursty_quota_rpm": round(rpm, 1),
        # a minute's allowance at once, then the refill over the window
        "bursty_allowed": math.floor(rpm + rpm / 60.0 * burst_s),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpuroute-tenants-") as tmp:
        for run in RUNS + (ROUTER_QUEUE_RUNS if spec.router_queue else ()):
            if on_run is not None:
                on_run(run)
            row = asyncio.run(
                one_run(run, spec, steady, bursty, rpm, Path(tmp) / str(len(report["runs"])))
            )
            report["runs"].append(row)
    alone = report["runs"][0]
    for row in report["runs"][1:]:
        mine = row["steady_in_burst"]
        row["steady_e2e_p99_vs_alone"] = round(
            mine["e2e_p99_s"] / alone["steady_in_burst"]["e2e_p99_s"], 3
        )
        row["steady_ttft_p99_vs_alone"] = round(
            mine["ttft_p99_s"] / alone["steady_in_burst"]["ttft_p99_s"], 3
        )
        row["steady_slowdown"] = paired_slowdown(
            alone["_steady"], row["_steady"], (spec.burst_from_s, spec.burst_to_s)
        )
    return report


def paired_slowdown(
    alone: list[RequestResult], other: list[RequestResult], window: tuple[float, float]
) -> dict:
    """The same steady requests (same arrivals, same sizes) in two runs: each one's E2E in
    `other` over its E2E alone. Long answers dominate any E2E percentile; the ratio per
    request does not care how long the answer was."""
    ratios = [
        b.e2e_s / a.e2e_s
        for a, b in zip(alone, other, strict=False)
        if a.ok and b.ok and window[0] <= a.sent_at < window[1] and a.e2e_s > 0
    ]
    if not ratios:
        return {"requests": 0}
    return {
        "requests": len(ratios),
        "p50": round(percentile(ratios, 50), 3),
        "p90": round(percentile(ratios, 90), 3),
        "p99": round(percentile(ratios, 99), 3),
    }


def print_tenants(console, report: dict) -> None:
    from rich.table import Table

    table = Table(
        title=(
            f"{report['replicas']} replicas; steady {report['steady_rps']} req/s, bursty "
            f"{report['bursty_rps']} req/s in {report['burst_window_s']} s, quota "
            f"{report['bursty_quota_rpm']} rpm (allows {report['bursty_allowed']})"
        )
    )
    for header in ("run", "steady TTFT p99", "steady E2E p99", "E2E p99 ÷ alone",
                   "slowdown p50/p90", "steady failed", "bursty ok", "bursty 429",
                   "GPU busy"):  # fmt: skip
        table.add_column(header, justify="left" if header == "run" else "right")
    for row in report["runs"]:
        mine, bursty = row["steady_in_burst"], row.get("bursty", {})
        table.add_row(
            row["run"], f"{mine['ttft_p99_s']:.3f}", f"{mine['e2e_p99_s']:.2f}",
            f"{row.get('steady_e2e_p99_vs_alone', 1.0):.3f}",
            "{p50} / {p90}".format(**row.get("steady_slowdown", {"p50": 1.0, "p90": 1.0})),
            str(row["steady"]["failed_other"] + row["steady"]["refused_429"]),
            str(bursty.get("ok", "-")), str(bursty.get("refused_429", "-")),
            f"{row['gpu_busy_mean']:.2f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        "steady latencies: requests sent during the burst window; slowdown: each of them "
        "against the same request in the run alone"
    )
