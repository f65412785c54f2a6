"""LoRA adapter affinity in the default policy (router/core/policies/adapter_affinity.py):
deterministic home sets, widening only when the home set has no room, the SLO first."""

from __future__ import annotations

import random

from gpuroute.router.backends.priors import engine_priors
from gpuroute.router.core import Backend, BackendSet, CostEstimator, RequestInfo, Scheduler
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.policies import build_policy
from gpuroute.router.core.policies.adapter_affinity import AdapterAffinity, rendezvous_key
from gpuroute.router.core.policies.base import PickTrace
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import life

PRIORS = engine_priors("llama-3.1-8b")
SLOTS = 4


def scheduler(n: int = 8) -> Scheduler:
    backends = BackendSet(Backend(f"gpu-{i}", "H100", ("m",)) for i in range(n))
    for b in backends:
        b.adapter_slots = SLOTS
    estimator = CostEstimator({gpu: p.cost for gpu, p in PRIORS.items()})
    latency = LatencyModel({gpu: p.latency for gpu, p in PRIORS.items()})
    return Scheduler(backends, build_policy("default"), estimator, latency=latency)


def route(
    sched: Scheduler, adapter: str | None, now: float = 0.0, rid: int = 1, trace=None, prompt=500
):
    info = RequestInfo(rid, "m", prompt, 100, arrived_at=now, adapter=adapter)
    decision = sched.route(life(info), now, random.Random(rid), trace=trace)
    assert decision is not None
    return decision


def affinity(sched: Scheduler) -> AdapterAffinity:
    return sched.policy.adapters  # type: ignore[attr-defined]


def order(sched: Scheduler, adapter: str) -> list[str]:
    return affinity(sched).order(sched.backends, "m", adapter)


def test_home_sets_are_the_rendezvous_order_the_same_in_every_router() -> None:
    one, other = scheduler(), scheduler()
    for adapter in ("lora-0", "lora-1", "sql"):
        assert order(one, adapter) == order(other, adapter)
        expected = sorted((f"gpu-{i}" for i in range(8)), key=lambda i: -rendezvous_key(adapter, i))
        assert order(one, adapter) == expected
    # adapters spread over the fleet instead of piling on one backend
    assert len({order(one, f"lora-{k}")[0] for k in range(20)}) >= 5


@given(st.sets(st.integers(0, 60), min_size=2, max_size=12), st.text(min_size=1, max_size=8))
def test_a_backend_leaving_keeps_every_other_backends_place(ids: set[int], adapter: str) -> None:
    names = [f"b{i}" for i in sorted(ids)]
    full = sorted(names, key=lambda i: -rendezvous_key(adapter, i))
    gone = full[0]
    rest = sorted((n for n in names if n != gone), key=lambda i: -rendezvous_key(adapter, i))
    assert rest == [n for n in full if n != gone]


def test_an_idle_fleet_sends_each_adapter_to_its_first_home_backend() -> None:
    sched = scheduler()
    for rid in range(5):
        assert route(sched, "lora-7", rid=rid).backend.backend_id == order(sched, "lora-7")[0]
    assert affinity(sched).width("lora-7", 0.0) == 1


def test_without_room_at_home_it_runs_where_the_adapter_already_is() -> None:
    sched = scheduler()
    home, second, third = (sched.backends.get(i) for i in order(sched, "x")[:3])
    home.adapters = frozenset(f"other-{k}" for k in range(SLOTS))  # every slot in use
    third.adapters = frozenset({"x"})
    assert route(sched, "x").backend is third  # no load, and the home set does not grow
    assert affinity(sched).width("x", 0.0) == 1
    third.adapters = frozenset(f"other-{k}" for k in range(SLOTS))
    assert route(sched, "x").backend is second  # no room anywhere it runs: grow by one
    assert affinity(sched).width("x", 0.0) == 2


def test_the_home_set_widens_under_load_and_shrinks_once_the_load_is_gone() -> None:
    sched = scheduler()
    home = order(sched, "hot")
    # 8,000-token prompts: about 0.24 s of prefill each, queued until their first tokens
    placed = [route(sched, "hot", rid=rid, prompt=8000).backend.backend_id for rid in range(20)]
    # three fill a backend's headroom (half the TTFT), then the next in order takes over
    assert [home.index(b) for b in placed] == [k // 3 for k in range(20)]
    width = affinity(sched).width("hot", 0.0)
    assert width == 7
    assert affinity(sched).width("hot", 30.0 * (width - 1) + 0.1) == 1


def test_the_slo_comes_first_a_home_backend_predicted_to_miss_is_not_used() -> None:
    sched = scheduler()
    home = sched.backends.get(order(sched, "x")[0])
    home.slowness = 400.0  # gray failure: its prefill would blow the TTFT
    decision = route(sched, "x")
    assert decision.fits and decision.backend is not home
    assert decision.backend.backend_id == order(sched, "x")[1]


def test_requests_without_an_adapter_are_not_narrowed() -> None:
    sched = scheduler()
    picked = {route(sched, None, rid=rid).backend.backend_id for rid in range(16)}
    assert len(picked) > 4


def test_the_adapter_stage_is_written_into_the_trace() -> None:
    sched = scheduler(3)
    home = order(sched, "x")
    sched.backends.get(home[0]).adapters = frozenset(f"o{k}" for k in range(SLOTS))
    trace = PickTrace(full=True)
    decision = route(sched, "x", trace=trace)
    assert decision.backend.backend_id == home[1]
    rows = trace.rows
    full = "no free adapter slot (4/4 in use)"
    assert rows[home[0]]["adapter"] == f"dropped: rank 1 of home width 2; {full}"
    assert rows[home[1]]["adapter"] == "kept: rank 2 of home width 2; a slot is free"
    assert rows[home[2]]["adapter"] == "dropped: rank 3 of home width 2; a slot is free"
