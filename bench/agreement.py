"""`gpuroute bench live --sim`: the simulator on the live bench's own fleet, requests and
time scale, beside what the live run measured.

The live engines run `time_scale` times slower than the GPUs they model, and the requests
arrive that much more slowly; the simulator runs the same requests at GPU speed, arrivals
compressed by the same factor, so its latencies times the time scale are the live ones'
prediction. Agreement is judged on SLO attainment (±0.05), TTFT p50 (±25 %) and each GPU
type's share of the requests (±0.05), the bounds docs/benchmarks.md reports against."""

from __future__ import annotations

import math
from itertools import groupby
from pathlib import Path

import aiohttp
import numpy as np
from gpuroute.sim.fleet import profile_gpu_types
from gpuroute.sim.report import OK
from gpuroute.sim.scenario import LoadedScenario, Scenario
from gpuroute.sim.simulator import FleetSimulator
from gpuroute.sim.workloads import Workload
from prometheus_client.parser import text_string_to_metric_families

from gpuroute.stats import percentile

ATTAINMENT_BOUND = 0.05
TTFT_P50_BOUND = 0.25
SHARE_BOUND = 0.05

AGREEMENT_COLUMNS = (
    ("policy", "policy", "{}"),
    ("live_attainment", "attainment live", "{:.3f}"),
    ("sim_attainment", "sim", "{:.3f}"),
    ("live_ttft_p50_s", "TTFT p50 live", "{:.3f}"),
    ("sim_ttft_p50_s", "sim", "{:.3f}"),
    ("ttft_p50_ratio", "sim ÷ live", "{:.2f}"),
    ("max_share_gap", "max GPU share gap", "{:.3f}"),
    ("agrees", "within bounds", "{}"),
)


def live_scenario(engines: list[str], slo_ttft_s: float, slo_tpot_s: float) -> LoadedScenario:
    """The live bench's fleet (engine order kept) and SLO as a scenario."""
    # consecutive engines of one type are one group, so engine order (and index) is kept
    groups = [{"type": gpu, "count": len(list(run))} for gpu, run in groupby(engines)]
    scenario = Scenario.model_validate(
        {
            "name": "bench-live",
            "workload": {"profile": "chat", "max_requests": 1, "rate_rps": 1.0},
            "gpus": groups,
            "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
        }
    )
    return LoadedScenario(scenario, Path("."), "bench live")


def simulate(
    engines: list[str],
    workload: Workload,
    time_scale: float,
    policy: str,
    slo: tuple[float, float],
    overhead_s: dict[str, float] | None = None,
) -> dict:
    """The simulator's attainment, TTFT p50 (in live seconds) and GPU shares for `policy`.
    The simulator has no HTTP path: `overhead_s`, the fixed TTFT per GPU type that the live
    router learned (gpuroute_latency_overhead_seconds), is added to each simulated TTFT."""
    loaded = live_scenario(engines, *slo)
    at_gpu_speed = workload.rescaled(time_scale)
    profiles = profile_gpu_types(loaded.scenario, at_gpu_speed)
    rate = (len(workload) - 1) / max(at_gpu_speed.span_s, 1e-9)
    report, run = FleetSimulator(loaded, (at_gpu_speed, profiles, rate)).replay(policy)
    ok = np.asarray(run.outcomes.status) == OK
    gpus = [run.engines[e].params.gpu.name for e in np.asarray(run.outcomes.served_by)[ok]]
    overhead = overhead_s or {}
    ttft = np.asarray(run.outcomes.ttft)[ok] * time_scale
    ttft = ttft + np.asarray([overhead.get(gpu, 0.0) for gpu in gpus])
    return {
        "slo_attainment": report.slo_attainment,
        "ttft_p50_s": percentile(ttft, 50),
        "gpu_share": {gpu: row["request_share"] for gpu, row in report.by_gpu_type.items()},
    }


async def learned_state(router_url: str) -> dict[str, dict]:
    """What the live router learned, from its /metrics: the fixed TTFT per GPU type
    (`overhead_s`), the TTFT and TPOT ratios per GPU type and each backend's slowness."""
    async with aiohttp.ClientSession() as session, session.get(router_url + "/metrics") as r:
        text = await r.text()
    state: dict[str, dict] = {"overhead_s": {}, "ratio": {}, "slowness": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels, value = sample.labels, round(sample.value, 4)
            if family.name == "gpuroute_latency_overhead_seconds":
                state["overhead_s"][labels["gpu"]] = value
            elif family.name == "gpuroute_latency_ratio":
                state["ratio"][f"{labels['gpu']}/{labels['measure']}"] = value
            elif family.name == "gpuroute_backend_slowness":
                state["slowness"][labels["backend"]] = value
    return state


def compare(live: dict, simulated: dict) -> dict:
    """One row: live against simulated, and whether each is within its bound."""
    live_shares, sim_shares = live.get("gpu_share", {}), simulated["gpu_share"]
    gap = max(
        (
            abs(live_shares.get(g, 0.0) - sim_shares.get(g, 0.0))
            for g in {*live_shares, *sim_shares}
        ),
        default=0.0,
    )
    live_ttft, sim_ttft = live["ttft_p50_s"], simulated["ttft_p50_s"]
    ratio = sim_ttft / live_ttft if live_ttft > 0 else math.inf
    attainment_gap = abs(live["slo_attainment"] - simulated["slo_attainment"])
    agrees = (
        attainment_gap <= ATTAINMENT_BOUND
        and abs(ratio - 1.0) <= TTFT_P50_BOUND
        and gap <= SHARE_BOUND
    )
    return {
        "policy": live["target"],
        "live_attainment": live["slo_attainment"],
        "sim_attainment": simulated["slo_attainment"],
        "live_ttft_p50_s": live_ttft,
        "sim_ttft_p50_s": round(sim_ttft, 4),
        "ttft_p50_ratio": round(ratio, 3),
        "max_share_gap": round(gap, 4),
        "live_gpu_share": live_shares,
        "sim_gpu_share": sim_shares,
        "agrees": "yes" if agrees else "no",
    }
