"""The simulator continues a stream whose engine crashed mid-answer as the live router does
(AttemptLoop.continued: prompt + tokens so far, what is left of the output), or, with
[continuation] off, counts it failed and lost."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from gpuroute.sim.report import FAILED, OK, table_columns
from gpuroute.sim.scenario import load_scenario
from gpuroute.sim.simulator import FleetSimulator

from gpuroute.config import ConfigError

CRASH_AT_S = 6.0
FLEET = f"""
name = "crash"
seed = 3
[workload]
profile = "chat"
rate_rps = 15
max_requests = 200
[[gpus]]
type = "H100"
count = 3
[router]
policies = ["least_outstanding_work"]
[[faults]]
at_s = {CRASH_AT_S}
kind = "crash"
gpu = 0
"""


def replay(tmp_path: Path, extra: str = "", faults: bool = True):
    text = FLEET if faults else FLEET[: FLEET.index("[[faults]]")]
    path = tmp_path / "crash.toml"
    path.write_text(text + extra)
    return FleetSimulator(load_scenario(path)).replay("least_outstanding_work")


def streaming_at_crash(tmp_path: Path) -> set[int]:
    """The streams gpu 0 was sending at the crash, read off a run without it (the runs are
    the same up to then)."""
    _, run = replay(tmp_path, faults=False)
    out, crash = run.outcomes, run.arrivals[0] + CRASH_AT_S
    return {
        rid
        for rid in range(run.n)
        if out.served_by[rid] == 0 and run.arrivals[rid] + out.ttft[rid] < crash < out.finish[rid]
    }


def test_a_crash_continues_every_stream_under_way_elsewhere(tmp_path) -> None:
    under_way = streaming_at_crash(tmp_path)
    assert len(under_way) >= 3  # the scenario puts several streams on gpu 0 then
    _, clean = replay(tmp_path, faults=False)
    report, run = replay(tmp_path)
    assert (report.streams_continued, report.streams_lost, report.failed) == (len(under_way), 0, 0)
    assert report.completed == report.requests == 200
    assert all(run.outcomes.status[rid] == OK for rid in under_way)
    for rid in under_way:  # the client's TTFT stays its first one; the answer went on elsewhere
        assert run.outcomes.ttft[rid] == clean.outcomes.ttft[rid]
        assert run.outcomes.served_by[rid] != 0
    # each continuation prefilled its prompt and at least its first token again, never its
    # whole answer
    prompts = sum(run.prompts[rid] for rid in under_way)
    outputs = sum(run.outputs[rid] for rid in under_way)
    resent = round(report.reprefill_share * sum(run.prompts), 0)
    assert prompts + len(under_way) <= resent < prompts + outputs
    assert 0 < report.reprefill_work_share < 1


def test_with_continuation_off_the_streams_fail(tmp_path) -> None:
    under_way = streaming_at_crash(tmp_path)
    report, run = replay(tmp_path, "[continuation]\nenabled = false\n")
    assert (report.streams_continued, report.streams_lost) == (0, len(under_way))
    assert report.failed == len(under_way)
    assert {r for r in range(run.n) if run.outcomes.status[r] == FAILED} == under_way
    assert report.reprefill_share == report.reprefill_work_share == 0.0
    assert all(math.isnan(run.outcomes.ttft[rid]) for rid in under_way)


SLOWED = """
name = "slowed"
seed = 5
[workload]
profile = "chat"
rate_rps = 12
max_requests = 400
[[gpus]]
type = "H100"
count = 3
[slo]
ttft_s = 2.0
tpot_s = 0.02
[router]
policies = ["default"]
[[faults]]
at_s = 8
kind = "slow"
gpu = 0
factor = 6
"""


def slowed(tmp_path: Path, extra: str = ""):
    path = tmp_path / "slowed.toml"
    path.write_text(SLOWED + extra)
    return FleetSimulator(load_scenario(path)).replay("default")


def test_rebalancing_moves_streams_through_the_continuation(tmp_path) -> None:
    """An H100 slowed 6x at 8 s (seen by the watch's slowness): streams there predicted to
    miss their TPOT move to the other two."""
    report, _ = slowed(tmp_path, "[rebalance]\nenabled = true\n")
    assert report.streams_moved > 0
    assert report.streams_continued == report.streams_moved  # no crash: every one a move
    assert (report.streams_lost, report.failed) == (0, 0)
    assert report.reprefill_share > 0
    off, _ = slowed(tmp_path)
    assert (off.streams_moved, off.streams_continued, off.reprefill_share) == (0, 0, 0.0)
    # streams that decoded 6x slow under a 0.02 s TPOT finish in time elsewhere
    assert report.slo_attainment > off.slo_attainment
    # continuation off: a move is a continuation, so asking for moves is refused, not ignored
    with pytest.raises(ConfigError, match=r"rebalance\.enabled needs continuation\.enabled"):
        slowed(tmp_path, "[rebalance]\nenabled = true\n[continuation]\nenabled = false\n")


def test_max_attempts_bounds_the_continuations_of_one_stream(tmp_path) -> None:
    """gpu 1 crashes too, soon after gpu 0: streams continued there from gpu 0 break again.
    With one continuation each they are lost; with two they go on a second time."""
    second = f'[[faults]]\nat_s = {CRASH_AT_S + 0.5}\nkind = "crash"\ngpu = 1\n'
    once, _ = replay(tmp_path, second + "[continuation]\nmax_attempts = 1\n")
    twice, _ = replay(tmp_path, second + "[continuation]\nmax_attempts = 2\n")
    assert once.streams_lost > 0 and once.failed == once.streams_lost
    assert twice.streams_lost == 0
    assert twice.streams_continued == once.streams_continued + once.streams_lost


def test_the_table_shows_continuations_only_where_a_stream_broke() -> None:
    quiet = {"streams_continued": 0, "streams_lost": 0}
    keys = [key for key, _, _ in table_columns([quiet])]
    assert "streams_continued" not in keys and "reprefill_share" not in keys
    keys = [key for key, _, _ in table_columns([quiet, {**quiet, "streams_lost": 3}])]
    after = keys.index("failed")
    assert keys[after + 1 : after + 4] == ["streams_continued", "streams_lost", "reprefill_share"]
