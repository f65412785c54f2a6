"""The simulator's LoRA adapter slots (sim/adapters.py): loads counted, LRU eviction of
idle adapters, requests waiting for a slot and for the load, exactly."""

from __future__ import annotations

import pytest
from gpuroute.sim.adapters import LoraEngine, LoraSection, assign_adapters
from gpuroute.sim.engine_model import EngineRequest

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams

PARAMS = EngineParams(GPU_SPECS["H100"], MODELS["llama-3.1-8b"])
LOAD_S = 0.1


def engine(slots: int) -> LoraEngine:
    return LoraEngine(PARAMS, LoraSection(adapters=10, max_loras=slots, load_s=LOAD_S))


def req(rid: int, adapter: str | None, output: int = 20) -> EngineRequest:
    return EngineRequest(rid, 100, output, 0.0, adapter=adapter)


def run(e: LoraEngine, until: float | None = None) -> list[EngineRequest]:
    done = []
    while (t := e.next_event_time()) is not None and (until is None or t <= until):
        done += e.on_event(t)
    return done


def test_a_cold_adapter_is_loaded_once_and_its_requests_start_after_the_load() -> None:
    e = engine(2)
    first, second = req(1, "a"), req(2, "a")
    assert e.submit(first, 0.0) and e.submit(second, 0.05)
    assert e.adapter_loads == 1 and e.num_waiting == 2 and e.adapters() == {"a"}
    run(e)
    assert first.admitted_at == pytest.approx(LOAD_S)  # waited for the load, not longer
    assert second.submitted_at == 0.05  # its TTFT still counts from its arrival here
    assert e.adapter_loads == 1 and e.adapters() == frozenset()


def test_a_resident_adapter_costs_no_load_and_the_least_recently_used_idle_one_goes() -> None:
    e = engine(2)
    for rid, adapter in enumerate(("a", "b")):
        e.submit(req(rid, adapter), 0.0)
    run(e)
    now = 10.0
    e.submit(req(3, "a"), now)  # resident: no load, starts at once
    assert e.adapter_loads == 2
    run(e)
    e.submit(req(4, "c"), 20.0)  # both slots idle: "b" was used least recently
    assert e.adapter_loads == 3 and list(e.slots.resident) == ["a", "c"]
    run(e)
    e.submit(req(5, "b"), 30.0)
    assert e.adapter_loads == 4 and list(e.slots.resident) == ["c", "b"]


def test_a_request_waits_for_a_slot_while_every_adapter_has_requests_running() -> None:
    e = engine(1)
    running, blocked = req(1, "a", output=200), req(2, "b")
    e.submit(running, 0.0)
    e.submit(blocked, 0.0)
    assert e.adapter_loads == 1 and e.adapters() == {"a", "b"}  # "b" waits (vLLM's label)
    assert e.num_waiting == 2
    run(e)
    assert blocked.admitted_at == pytest.approx(running.finished_at + LOAD_S)
    assert e.adapter_loads == 2


def test_a_request_of_a_resident_adapter_passes_one_waiting_for_a_slot() -> None:
    e = engine(1)
    e.submit(req(1, "a", output=200), 0.0)
    blocked, same = req(2, "b"), req(3, "a")
    e.submit(blocked, 0.0)
    run(e, until=0.2)
    e.submit(same, 0.2)
    run(e)
    assert same.admitted_at == pytest.approx(0.2)
    assert blocked.admitted_at > same.finished_at


def test_base_model_requests_take_no_slot() -> None:
    e = engine(1)
    e.submit(req(1, "a", output=200), 0.0)
    base = req(2, None)
    e.submit(base, 0.0)
    run(e)
    assert base.admitted_at == 0.0 and e.adapter_loads == 1


def test_an_aborted_request_frees_its_slot_and_a_crash_loses_the_waiting_ones() -> None:
    e = engine(1)
    running, blocked, later = req(1, "a", output=200), req(2, "b"), req(3, "c")
    for r in (running, blocked, later):
        e.submit(r, 0.0)
    assert e.abort(blocked, 0.01) and not e.abort(blocked, 0.01)
    assert e.abort(running, 0.02)  # "a" is idle now: "c" evicts it and loads
    assert e.adapter_loads == 2 and list(e.slots.resident) == ["c"]
    lost = e.crash(0.03)
    assert lost == [later] and e.adapters() == frozenset()


def test_adapters_are_drawn_by_zipf_like_popularity_from_the_seed() -> None:
    lora = LoraSection(adapters=50, skew=1.0)
    drawn = assign_adapters(20_000, lora, seed=3)
    assert drawn == assign_adapters(20_000, lora, seed=3)
    assert drawn != assign_adapters(20_000, lora, seed=4)
    share = {name: drawn.count(name) / len(drawn) for name in set(drawn)}
    harmonic = sum(1 / (k + 1) for k in range(50))
    assert share["lora-0"] == pytest.approx(1 / harmonic, abs=0.01)
    assert share["lora-9"] == pytest.approx(0.1 / harmonic, abs=0.005)
    assert assign_adapters(5, None, seed=3) == [None] * 5
    with_base = assign_adapters(20_000, LoraSection(adapters=5, base_share=0.5), seed=3)
    assert with_base.count(None) / 20_000 == pytest.approx(0.5, abs=0.02)
