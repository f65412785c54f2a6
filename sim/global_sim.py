"""Discrete-event simulation of several regions behind the global tier.

Each region runs the router's own Scheduler (least outstanding work) over EngineModels; the
global decision is the global tier's own GlobalPolicy, fed every `report_period_s` with each
region's summary (the same `summarise` the regional router reports). A client's latency is
what the region gives it plus one estimated RTT. Policies compared on the same arrivals:
`nearest`, `latency` and `ours` (latency + queueing + spillover)."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
from gpuroute.global_.core.geo import Point, estimated_rtt_s
from gpuroute.global_.core.policy import GlobalPolicy, GlobalRequest, RegionView
from gpuroute.global_.core.residency import ANY, Allowed
from gpuroute.global_.core.spillover import Spillover
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.lifetime import Event, Lifetimes
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from gpuroute.router.core.region_summary import summarise
from gpuroute.router.core.scheduler import Outcome
from gpuroute.sim.engine_model import EngineModel, EngineRequest
from gpuroute.sim.events import EventHeap
from gpuroute.sim.fleet import GpuTypeProfile, fleet_capacity_rps, profile_gpu_types
from gpuroute.sim.scenario import LoadedScenario
from gpuroute.sim.workloads import synthetic

from gpuroute.stats import percentile

REPORT, EVENT = -1, -2


@dataclass
class Clients:
    """The request stream: arrival, client group, client location, allowed set."""

    arrivals: np.ndarray
    group: np.ndarray
    points: list[Point]
    allowed: list[Allowed]
    prompts: np.ndarray
    outputs: np.ndarray
    flash: tuple[float, float] | None  # window of the first flash crowd, if any


def build_clients(loaded: LoadedScenario, rate: float) -> Clients:
    sc, g = loaded.scenario, loaded.scenario.global_
    assert g is not None
    rng = np.random.default_rng(sc.seed)
    region = {r.name: r for r in g.regions}
    total_share = sum(c.share for c in g.clients)
    times, groups = [], []
    for k, c in enumerate(g.clients):
        base = rate * c.share / total_share
        n = rng.poisson(base * g.duration_s)
        times.append(rng.uniform(0, g.duration_s, n))
        groups.append(np.full(n, k))
        for e in g.events:
            if e.kind == "flash_crowd" and e.region == c.region:
                extra = rng.poisson(base * (e.factor - 1) * e.duration_s)
                times.append(rng.uniform(e.at_s, e.at_s + e.duration_s, extra))
                groups.append(np.full(extra, k))
    arrivals, group = np.concatenate(times), np.concatenate(groups)
    order = np.argsort(arrivals, kind="stable")
    arrivals, group = arrivals[order], group[order]
    lengths = synthetic(sc.workload.profile or "chat", len(arrivals), 1.0, sc.seed + 1)
    points, allowed = [], []
    bound_draw = rng.random(len(arrivals))
    jitter = rng.normal(0, 3.0, (len(arrivals), 2))
    for i, k in enumerate(group):
        c = g.clients[k]
        home = region[c.region]
        points.append(Point(home.lat + jitter[i, 0], home.lon + jitter[i, 1]))
        bound = bound_draw[i] < c.bound
        allowed.append(
            Allowed(frozenset({home.jurisdiction}), ("home",)) if bound else Allowed(ANY)
        )
    flash = next(
        ((e.at_s, e.at_s + e.duration_s) for e in g.events if e.kind == "flash_crowd"), None
    )
    return Clients(arrivals, group, points, allowed, lengths.prompts, lengths.outputs, flash)


@dataclass
class RegionSim:
    name: str
    jurisdiction: str
    location: Point
    scheduler: Scheduler
    engines: list[EngineModel]
    index: dict[str, int] = field(default_factory=dict)
    up: bool = True


def run_global(
    loaded: LoadedScenario, mode: str, clients: Clients, profiles: dict[str, GpuTypeProfile]
) -> dict:
    started = time.perf_counter()
    run = GlobalRun(loaded, mode, clients, profiles)
    run.run()
    return report(loaded, mode, clients, run.regions, run.served_in, run.rtt, run.ttft,
                  run.finish, run.status, time.perf_counter() - started)  # fmt: skip


def build_regions(
    loaded: LoadedScenario, profiles: dict[str, GpuTypeProfile]
) -> dict[str, RegionSim]:
    """Each region's engines under its own Scheduler (least outstanding work)."""
    sc, g = loaded.scenario, loaded.scenario.global_
    assert g is not None
    default = sc.workload.model
    fastest = max(p.capacity_rps for p in profiles.values())
    regions: dict[str, RegionSim] = {}
    for r in g.regions:
        backends, engines = [], []
        for grp in (x for x in sc.gpus if x.region == r.name):
            kind = grp.kind(default)
            key = kind.key(default)
            for _ in range(grp.count):
                p = profiles[key]
                backends.append(Backend(f"{r.name}-{len(backends)}", key, (kind.model,),
                                        capacity=p.capacity_rps / fastest,
                                        gpu=kind.gpu, gpus=kind.gpus))  # fmt: skip
                engines.append(EngineModel(p.params, prefix_caching=sc.prefix_caching))
        estimator = CostEstimator({t: p.prior for t, p in profiles.items()})
        scheduler = Scheduler(BackendSet(backends), LeastOutstandingWork(), estimator)
        sim = RegionSim(r.name, r.jurisdiction, Point(r.lat, r.lon), scheduler, engines)
        sim.index = {b.backend_id: i for i, b in enumerate(backends)}
        regions[r.name] = sim
    return regions


class GlobalRun:
    """One global policy's run: arrivals placed by the global decision, region reports,
    outages, and every region's engines on one event heap."""

    def __init__(
        self,
        loaded: LoadedScenario,
        mode: str,
        clients: Clients,
        profiles: dict[str, GpuTypeProfile],
    ) -> None:
        sc, g = loaded.scenario, loaded.scenario.global_
        assert g is not None
        self.g, self.clients, self.model = g, clients, sc.workload.model
        self.regions = build_regions(loaded, profiles)
        self.engine_of = [(r.name, i) for r in self.regions.values() for i in range(len(r.engines))]
        self.eid = {key: n for n, key in enumerate(self.engine_of)}
        self.spill = Spillover()
        self.policy = GlobalPolicy(mode, self.spill)
        self.rng = random.Random(sc.seed)
        self.views: list[RegionView] = []
        n = len(clients.arrivals)
        self.served_in = [""] * n
        self.rtt = np.zeros(n)
        self.ttft, self.finish = np.full(n, np.nan), np.full(n, np.nan)
        self.status = np.zeros(n, dtype=np.int8)  # 0 pending, 1 ok, 2 failed/refused
        self.orders: dict[int, list[str]] = {}
        self.lifetimes = Lifetimes()  # a request's bookings, whichever region holds them
        self.events = sorted(g.events, key=lambda e: e.at_s)
        self.heap = EventHeap(len(self.engine_of))

    def run(self) -> None:
        self.heap.push(0.0, REPORT)
        for k, e in enumerate(self.events):
            if e.kind == "outage":
                self.heap.push(e.at_s, EVENT, 2 * k)
                self.heap.push(e.at_s + e.duration_s, EVENT, 2 * k + 1)
        self.refresh_views()
        self.heap.run(self.clients.arrivals.tolist(), self.arrive, self.on_event)

    def refresh_views(self) -> None:
        self.views.clear()
        for r in self.regions.values():
            s = summarise(r.scheduler.backends, self.g.saturation_delay_s)
            self.spill.update(r.name, s.utilisation)
            self.views.append(RegionView(r.name, r.jurisdiction, r.location, r.up, s.queue_delay_s))

    def arrive(self, i: int, now: float) -> None:
        c = self.clients
        request = GlobalRequest(self.model, c.allowed[i], c.points[i])
        self.orders[i] = list(self.policy.decide(request, self.views, self.rng).order)
        self.place(i, now)

    def on_event(self, now: float, kind: int, payload: int, arrivals_left: bool) -> None:
        if kind >= 0:
            self.engine_event(kind, now)
        elif kind == REPORT:
            self.refresh_views()
            if arrivals_left:
                self.heap.push(now + self.g.report_period_s, REPORT)
        else:
            self.outage(self.events[payload // 2].region, payload % 2 == 0, now)

    def reschedule(self, region: str, i: int) -> None:
        engine = self.regions[region].engines[i]
        self.heap.reschedule(self.eid[(region, i)], engine.next_event_time())

    def engine_event(self, e: int, now: float) -> None:
        name, k = self.engine_of[e]
        r = self.regions[name]
        for req in r.engines[k].on_event(now):
            outcome = Outcome(True, req.output_tokens, req.prompt_tokens)
            life = self.lifetimes.get(req.rid)
            assert life is not None
            r.scheduler.finish(life, outcome, now)
            self.lifetimes.close(life, Event.FINISH)
            self.status[req.rid], self.ttft[req.rid] = 1, req.first_token_at
            self.finish[req.rid] = now
            self.orders.pop(req.rid, None)
        self.reschedule(name, k)

    def place(self, rid: int, now: float) -> None:
        """The first region of the request's order that takes it; failed when none does."""
        order, c = self.orders[rid], self.clients
        life = self.lifetimes.get(rid)
        if life is None:
            life = self.lifetimes.open(RequestInfo(rid, self.model, int(c.prompts[rid])))
            life.move(Event.ADMIT)
        while order:
            name = order.pop(0)
            r = self.regions[name]
            if not r.up:
                continue
            decision = r.scheduler.route(life, now, self.rng)  # a region tries all of its own
            if decision is None:
                continue
            i = r.index[decision.backend.backend_id]
            req = EngineRequest(rid, int(c.prompts[rid]), int(c.outputs[rid]), now)
            if r.engines[i].fits(req) and r.engines[i].submit(req, now):
                life.move(Event.PLACE)
                self.served_in[rid] = name
                self.rtt[rid] = estimated_rtt_s(c.points[rid], r.location)
                self.reschedule(name, i)
                return
            r.scheduler.finish(life, Outcome(False), now)
        self.lifetimes.close(life, Event.FAIL)
        self.status[rid] = 2

    def outage(self, name: str, down: bool, now: float) -> None:
        r = self.regions[name]
        r.up = not down
        for i, engine in enumerate(r.engines):
            if down:
                for req in engine.crash(now):
                    life = self.lifetimes.get(req.rid)
                    assert life is not None
                    r.scheduler.finish(life, Outcome(False), now)
                    if req.first_token_at < 0 and self.orders.get(req.rid):
                        life.move(Event.ATTEMPT_FAILED)
                        self.place(req.rid, now)  # nothing reached the client: next region
                    else:
                        self.lifetimes.close(life, Event.FAIL)
                        self.status[req.rid] = 2
            else:
                engine.recover(now)
            self.reschedule(name, i)
        self.refresh_views()


def report(loaded, mode, clients, regions, served_in, rtt, ttft, finish, status, wall) -> dict:
    g, slo = loaded.scenario.global_, loaded.scenario.slo
    arrivals = clients.arrivals
    ok = status == 1
    e2e = finish - arrivals + rtt
    first = ttft - arrivals + rtt
    home = np.array([g.clients[k].region for k in clients.group])
    region_of = {r.name: r for r in regions.values()}
    served = np.array(served_in)
    violations = sum(
        1
        for i in np.flatnonzero(ok)
        if not clients.allowed[i].permits(region_of[served[i]].jurisdiction)
    )
    outputs = clients.outputs
    tpot = np.where(outputs > 1, (e2e - first) / np.maximum(outputs - 1, 1), 0.0)
    good = ok & (first <= slo.ttft_s) & (tpot <= slo.tpot_s)

    def p99(mask) -> float:
        values = e2e[mask & ok]
        return round(percentile(values, 99), 3)  # nan when none (round keeps it)

    steady = arrivals < (clients.flash[0] if clients.flash else math.inf)
    in_flash = (
        (arrivals >= clients.flash[0]) & (arrivals < clients.flash[1])
        if clients.flash
        else np.zeros(len(arrivals), bool)
    )
    away = ok & (served != home)
    per_region = {
        r: {"served": int((ok & (served == r)).sum()), "e2e_p99_s": p99(served == r),
            "clients_e2e_p99_s": p99(home == r)}
        for r in region_of
    }  # fmt: skip
    return {
        "policy": mode,
        "requests": len(arrivals),
        "completed": int(ok.sum()),
        "failed": int((status != 1).sum()),
        "e2e_p99_s": p99(np.ones(len(arrivals), bool)),
        "e2e_p99_steady_s": p99(steady),
        "e2e_p99_flash_s": p99(in_flash) if clients.flash else float("nan"),
        "flash_vs_steady": round(p99(in_flash) / p99(steady), 2) if clients.flash else float("nan"),
        "goodput_rps": round(float(good.sum()) / g.duration_s, 2),
        "served_away_from_home": int(away.sum()),
        "served_away_share": round(float(away.sum()) / max(int(ok.sum()), 1), 4),
        "residency_violations": violations,
        "regions": per_region,
        "sim_wall_s": round(wall, 2),
    }


def run_global_scenario(loaded: LoadedScenario, policies: list[str] | None = None) -> dict:
    sc = loaded.scenario
    assert sc.global_ is not None
    probe = synthetic(sc.workload.profile or "chat", 4000, 1.0, sc.seed)
    profiles = profile_gpu_types(sc, probe)  # measured once: each policy runs the same fleet
    capacity = fleet_capacity_rps(sc, profiles)
    utilisation = sc.workload.target_utilization or 0.5
    rate = utilisation * capacity
    clients = build_clients(loaded, rate)
    rows = [run_global(loaded, mode, clients, profiles) for mode in policies or sc.global_.policies]
    return {"scenario": sc.name, "rate_rps": round(rate, 1), "capacity_rps": round(capacity, 1),
            "gpus": sc.gpu_count, "rows": rows}  # fmt: skip
