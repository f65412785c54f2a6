"""`gpuroute bench decide`: how long one routing decision takes in the router's core.

A fleet of `backends` GPUs (H100, A100, L4 and T4 in the ratio 1:2:4:3) serves a stream of
chat-sized requests, a third sharing prompt prefixes; the scheduler keeps `in_flight`
requests per backend outstanding (each finishing with a first token, then its end, as in
the router), so the latency model, the prefix index and the ledger are as full as in a busy
fleet. Only `Scheduler.route` is timed, each call alone (perf_counter_ns), the booking
included; least connections is timed in the same run on the same requests as the
baseline."""

from __future__ import annotations

import random
import time
from collections import deque

import numpy as np
from gpuroute.bench.global_decisions import timing_row
from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core.backend import Backend, BackendSet
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies import build_policy, resolve_policy_name
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.scheduler import Outcome, Scheduler
from gpuroute.router.core.slo import DEFAULT_SLO_CLASSES

MODEL = "llama-3.1-8b"
MIX = ("H100", "A100", "A100", "L4", "L4", "L4", "L4", "T4", "T4", "T4")
DECIDE_COLUMNS = (
    ("policy", "policy", "{}"),
    ("backends", "backends", "{}"),
    ("decisions", "decisions", "{:,}"),
    ("p50_us", "p50 µs", "{:.1f}"),
    ("p99_us", "p99 µs", "{:.1f}"),
    ("p999_us", "p99.9 µs", "{:.1f}"),
    ("p99_vs_least_connections", "p99 ÷ least conn.", "{:.2f}"),
)


def build(policy: str, n_backends: int) -> Scheduler:
    """A scheduler as the router builds one (router/http/server.py), over `n_backends`."""
    priors = engine_priors(MODEL)
    backends = BackendSet()
    for i in range(n_backends):
        gpu = MIX[i % len(MIX)]
        backends.add(Backend(f"gpu-{i}", gpu, (MODEL,), capacity=priors[gpu].capacity))
    estimator = CostEstimator({gpu: p.cost for gpu, p in priors.items()})
    latency = LatencyModel({gpu: p.latency for gpu, p in priors.items()})
    return Scheduler(backends, build_policy(policy), estimator, latency=latency)


def requests(n: int, rng: random.Random) -> list[RequestInfo]:
    classes = DEFAULT_SLO_CLASSES
    out = []
    for i in range(n):
        prompt = int(min(rng.lognormvariate(6.5, 1.0), 16_000)) + 1
        shared = rng.random() < 1 / 3
        group = rng.randrange(50)  # 50 shared prefixes of 4 blocks each
        blocks = tuple(group * 1000 + k for k in range(4)) if shared else ()
        slo = classes[rng.choices(range(len(classes)), (0.3, 0.5, 0.2))[0]]
        out.append(RequestInfo(i, MODEL, prompt, prefix_blocks=blocks, slo=slo))
    return out


def time_decisions(scheduler: Scheduler, reqs: list[RequestInfo], keep: int, seed: int):
    """Route every request (timed), finishing the oldest whenever more than `keep` are out."""
    rng = random.Random(seed)
    clock = time.perf_counter_ns
    samples = np.empty(len(reqs), dtype=np.int64)
    out: deque[RequestLifetime] = deque()
    now = 0.0
    for i, req in enumerate(reqs):
        now += 0.001
        req.arrived_at = now
        life = RequestLifetime(req)
        t0 = clock()
        decision = scheduler.route(life, now, rng)
        samples[i] = clock() - t0
        if decision is not None:
            out.append(life)
        while len(out) > keep:
            done = out.popleft()
            scheduler.first_token(done, now, 0.2)
            scheduler.finish(done, Outcome(True, output_tokens=200, tpot_s=0.03), now)
    return samples / 1000.0  # µs


def run_decide_bench(
    n_backends: int = 100,
    decisions: int = 50_000,
    policies: list[str] | None = None,
    in_flight: int = 8,
    seed: int = 1,
) -> dict:
    names = [resolve_policy_name(p) for p in policies or ["default"]]
    names = ["least_connections"] + [n for n in names if n != "least_connections"]
    warm = min(5_000, decisions)  # fills the ledger, the latency model and the prefix index
    rows = []
    for name in names:
        reqs = requests(warm + decisions, random.Random(seed))
        us = time_decisions(build(name, n_backends), reqs, n_backends * in_flight, seed)[warm:]
        rows.append(
            {"policy": name, "backends": n_backends, "decisions": decisions} | timing_row(us)
        )
    base = rows[0]["p99_us"]
    for row in rows:
        row["p99_vs_least_connections"] = row["p99_us"] / base
    return {"backends": n_backends, "in_flight_per_backend": in_flight, "rows": rows}
