"""The engine model's timings, checked against its own formulas event by event."""

from __future__ import annotations

import pytest
from gpuroute.sim.engine_model import EngineModel, EngineRequest

from gpuroute.gpus import GPU_SPECS
from gpuroute.models import MODELS
from gpuroute.roofline import EngineParams

MODEL = MODELS["llama-3.1-8b"]


def params(gpu="A100", **kw) -> EngineParams:
    return EngineParams(GPU_SPECS[gpu], MODEL, **kw)


def run_until_idle(engine: EngineModel, limit: int = 10_000) -> list[EngineRequest]:
    done = []
    for _ in range(limit):
        t = engine.next_event_time()
        if t is None:
            return done
        done += engine.on_event(t)
    raise AssertionError("engine did not go idle")


def test_gpu_speed_ordering_matches_the_data_sheets() -> None:
    costs = {g: params(g).decode_token_cost_s(1000, 200) for g in ("H100", "A100", "V100", "L4")}
    assert costs["H100"] < costs["A100"] < costs["V100"] < costs["L4"]
    prefill = {g: params(g).prefill_s(1000) for g in ("H100", "A100", "L4", "T4")}
    assert prefill["H100"] < prefill["A100"] < prefill["L4"] < prefill["T4"]


def test_a_model_that_does_not_fit_is_a_clear_error() -> None:
    big = MODELS["llama-3.1-8b"].__class__("huge", 70, 80, 8, 128, 8192, weight_bytes=2)
    with pytest.raises(ValueError, match="does not fit on T4"):
        EngineParams(GPU_SPECS["T4"], big)


def test_single_request_timing_is_exact_without_chunked_prefill() -> None:
    p = params(chunked_prefill=False)
    engine = EngineModel(p)
    req = EngineRequest(1, prompt_tokens=1000, output_tokens=11, arrival=0.0)
    assert engine.submit(req, 0.0)
    (done,) = run_until_idle(engine)
    assert done.first_token_at == pytest.approx(p.prefill_s(1000))
    step = p.step_s(1, req.ctx)
    assert done.finished_at == pytest.approx(p.prefill_s(1000) + 10 * step)
    assert engine.kv_used == 0


def test_chunked_prefill_fits_a_short_prompt_in_one_step() -> None:
    p = params()
    engine = EngineModel(p)
    req = EngineRequest(1, prompt_tokens=1000, output_tokens=11, arrival=0.0)
    engine.submit(req, 0.0)
    (done,) = run_until_idle(engine)
    first = p.step_s(0, 0.0, 1000 * p.prefill_compute_s_per_token(1000))
    assert done.first_token_at == pytest.approx(first)
    assert done.finished_at == pytest.approx(first + 10 * p.step_s(1, req.ctx))


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget() -> None:
    p = params("L4")  # 2048-token budget on a 24 GB GPU
    assert p.max_num_batched_tokens == 2048
    engine = EngineModel(p)
    decoding = EngineRequest(1, 100, 10_000, 0.0)
    engine.submit(decoding, 0.0)
    engine.on_event(engine.next_event_time())
    t0 = decoding.first_token_at
    long = EngineRequest(2, 5000, 2, t0)
    engine.submit(long, t0)
    while long.first_token_at < 0:
        engine.on_event(engine.next_event_time())
    chunk = 2048 - 1
    step = p.step_s(1, decoding.ctx, chunk * p.prefill_compute_s_per_token(5000))
    assert long.first_token_at - t0 == pytest.approx(5000 / chunk * step)
    # the running request kept decoding through the whole prefill, one token per step
    assert engine.tokens_generated(decoding, long.first_token_at) == 1 + int(5000 / chunk)


def test_chunked_prefill_keeps_decoding_where_a_plain_prefill_stalls_it() -> None:
    tpot = {}
    for chunked in (True, False):
        engine = EngineModel(params("L4", chunked_prefill=chunked))
        decoding = EngineRequest(1, 100, 200, 0.0)
        engine.submit(decoding, 0.0)
        for rid in range(2, 6):
            engine.submit(EngineRequest(rid, 4000, 2, 0.0), 0.0)
        run_until_idle(engine)
        tpot[chunked] = (decoding.finished_at - decoding.first_token_at) / 199
    assert tpot[True] < tpot[False]


def test_batching_slows_each_step_but_raises_throughput() -> None:
    p = params()
    alone = EngineModel(p)
    alone.submit(EngineRequest(1, 500, 101, 0.0), 0.0)
    (solo,) = run_until_idle(alone)
    crowd = EngineModel(p)
    for rid in range(32):
        crowd.submit(EngineRequest(rid, 500, 101, 0.0), 0.0)
    finished = run_until_idle(crowd)
    assert len(finished) == 32
    makespan = max(r.finished_at for r in finished)
    assert makespan < 32 * solo.finished_at / 4  # far better than serial
    tpot = [(r.finished_at - r.first_token_at) / 100 for r in finished]
    assert min(tpot) > (solo.finished_at - solo.first_token_at) / 100


def test_kv_capacity_makes_requests_wait_fcfs() -> None:
    p = params("L4")
    engine = EngineModel(p)
    half = p.kv_capacity_tokens // 2
    a = EngineRequest(1, half - 100, 50, 0.0)
    b = EngineRequest(2, half - 100, 50, 0.0)
    c = EngineRequest(3, half - 100, 50, 0.0)
    for r in (a, b, c):
        assert engine.submit(r, 0.0)
    run_until_idle(engine)
    assert engine.kv_peak <= engine.kv_capacity
    assert c.admitted_at >= min(a.finished_at, b.finished_at)
    too_big = EngineRequest(4, p.kv_capacity_tokens, 10, 0.0)
    assert not engine.submit(too_big, 0.0)


def test_prefix_cache_hit_skips_prefill() -> None:
    p = params(chunked_prefill=False)
    engine = EngineModel(p)
    first = EngineRequest(1, 2048, 2, 0.0, blocks=(1, 2, 3, 4))
    engine.submit(first, 0.0)
    run_until_idle(engine)
    second = EngineRequest(2, 2600, 2, 10.0, blocks=(1, 2, 3, 4, 5, 6))
    engine.submit(second, 10.0)
    run_until_idle(engine)
    assert second.cached_tokens == 2048
    assert second.first_token_at - 10.0 == pytest.approx(p.prefill_s(2600 - 2048))
    assert engine.prefix_cache.hits == 4 and engine.prefix_cache.lookups == 10


def test_slowdown_stretches_remaining_work() -> None:
    p = params()
    engine = EngineModel(p)
    req = EngineRequest(1, 100, 101, 0.0)
    engine.submit(req, 0.0)
    t_first = engine.next_event_time()
    engine.on_event(t_first)
    normal_end = engine.next_event_time()
    midway = t_first + (normal_end - t_first) / 2
    engine.set_slowdown(3.0, midway)
    assert engine.next_event_time() == pytest.approx(midway + 3 * (normal_end - midway))
    assert engine.tokens_generated(req, midway) == pytest.approx(51, abs=1)


def test_crash_loses_everything_and_recover_serves_again() -> None:
    engine = EngineModel(params())
    reqs = [EngineRequest(i, 200, 50, 0.0) for i in range(5)]
    for r in reqs:
        engine.submit(r, 0.0)
    engine.on_event(engine.next_event_time())
    lost = engine.crash(0.5)
    assert sorted(r.rid for r in lost) == [0, 1, 2, 3, 4]
    assert engine.next_event_time() is None and not engine.submit(EngineRequest(9, 1, 1, 1.0), 1.0)
    engine.recover(2.0)
    assert engine.submit(EngineRequest(10, 100, 5, 2.0), 2.0)
    assert len(run_until_idle(engine)) == 1


def test_busy_time_counts_prefill_and_decode_but_not_idle() -> None:
    p = params(chunked_prefill=False)
    engine = EngineModel(p)
    req = EngineRequest(1, 1000, 11, 0.0)
    engine.submit(req, 0.0)
    run_until_idle(engine)
    engine.submit(EngineRequest(2, 1000, 11, 100.0), 100.0)
    run_until_idle(engine)
    assert engine.busy_s == pytest.approx(2 * req.finished_at)


@pytest.mark.parametrize("chunked", [False, True])
def test_an_aborted_request_frees_its_place_at_once(chunked: bool) -> None:
    """A client that hangs up: the request leaves whichever stage it is in and its KV is
    freed (the fake engine once ran such requests to the end)."""
    engine = EngineModel(params("H100", chunked_prefill=chunked))
    reqs = [EngineRequest(i, 2000, 400, 0.0) for i in range(3)]
    for req in reqs:
        engine.submit(req, 0.0)
    assert engine.prefilling is reqs[0] and list(engine.waiting) == reqs[1:]
    assert engine.abort(reqs[2], 0.0)  # waiting
    assert list(engine.waiting) == [reqs[1]]
    assert engine.abort(reqs[0], 0.001)  # prefilling: the next one starts
    assert engine.prefilling is reqs[1] and engine.kv_used == 2400
    t = engine.next_event_time()
    engine.on_event(t)  # reqs[1] joins the batch
    assert engine.batch == 1
    assert engine.abort(reqs[1], t + 0.01)  # running
    assert engine.batch == 0 and engine.kv_used == 0 and engine.ctx_sum == 0
    assert engine.next_event_time() is None
    assert not engine.abort(reqs[1], t + 0.02)  # gone already
    assert engine.num_running == 0 and engine.num_waiting == 0


def test_aborting_the_request_at_the_head_lets_the_next_one_in() -> None:
    """The head of the queue waits for KV; aborting it must start the next that fits."""
    engine = EngineModel(params("L4"))
    most = int(engine.kv_capacity * 0.6)
    first = EngineRequest(0, most - 100, 100, 0.0)
    head = EngineRequest(1, most - 100, 100, 0.0)  # does not fit beside `first`
    small = EngineRequest(2, 100, 10, 0.0)
    for req in (first, head, small):
        engine.submit(req, 0.0)
    t = engine.next_event_time()
    engine.on_event(t)  # first prefilled and decoding; head still waits for KV
    assert engine.prefilling is None and list(engine.waiting) == [head, small]
    assert engine.abort(head, t)
    assert engine.prefilling is small and not engine.waiting
