"""Progress on long commands (issue 34, item 6; issue 45, item 7): a bar on a terminal,
plain lines when stderr is a file or a pipe, none with `--quiet`; `capacity` steps once per
load it runs, `plan` once per simulator run, `bench live` and `bench real` once per
request."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console
from rich.progress import Progress

from gpuroute.console.progress import PLAIN_EVERY_S, PlainProgress, progress_bar


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=100)


def test_a_bar_for_a_person_at_a_terminal_and_lines_for_a_log() -> None:
    assert isinstance(progress_bar(console=terminal()), Progress)
    assert not progress_bar(console=terminal()).disable
    assert progress_bar(quiet=True, console=terminal()).disable
    piped = Console(file=io.StringIO())  # a file, a pipe, CI
    assert isinstance(progress_bar(console=piped), PlainProgress)
    assert progress_bar(quiet=True, console=piped).disable
    assert progress_bar(console=terminal(), mode="none").disable
    assert isinstance(progress_bar(console=terminal(), mode="plain"), PlainProgress)
    with pytest.raises(ValueError, match="progress mode 'loud'"):
        progress_bar(mode="loud")


def test_plain_progress_says_a_line_at_the_start_every_few_seconds_and_at_the_end() -> None:
    out, now = io.StringIO(), [100.0]
    with PlainProgress(Console(file=out, width=200), clock=lambda: now[0]) as shown:
        task = shown.add_task("capacity slo_aware", total=14)
        shown.advance(task)
        now[0] += PLAIN_EVERY_S - 1  # too soon for a line
        shown.advance(task)
        now[0] += 1
        shown.advance(task)  # 5 s since the last: a line
        shown.update(task, completed=14)  # done: a line at once
        other = shown.add_task("plan: simulator runs")  # no total
        now[0] += 2
        shown.advance(other)
    assert out.getvalue().splitlines() == [
        "capacity slo_aware: started, 14 to do",
        "capacity slo_aware: 3 of 14, 5 s",
        "capacity slo_aware: 14 of 14, 5 s, done",
        "plan: simulator runs: started",
        "plan: simulator runs: 1, 2 s",  # where it stopped, when the block ends
    ]


def test_capacity_steps_once_per_load_it_runs() -> None:
    from gpuroute.sim.capacity import OVERLOADS, CapacitySearch

    class Simulator:
        rate_rps = 10.0

        def __init__(self, utilization: float) -> None:
            self.utilization = utilization

        def at_utilization(self, utilization: float) -> Simulator:
            return Simulator(utilization)

        def run(self, _policy: str):
            met = 1.0 if self.utilization <= 0.6 else 0.5
            return SimpleNamespace(slo_attainment=met, goodput_rps=1.0, by_model={})

    steps = []
    search = CapacitySearch(Simulator(1.0), "round_robin", 0.9, on_run=lambda: steps.append(1))
    result = search.result()
    assert 0.55 < result.slo_capacity_utilization <= 0.6
    assert len(steps) == len(search.runs) <= CapacitySearch.MOST_RUNS
    assert 2 + CapacitySearch.ITERATIONS + len(OVERLOADS) == CapacitySearch.MOST_RUNS


def test_bench_live_tells_of_each_target_unless_quiet_and_steps_per_request_sent() -> None:
    from gpuroute.bench.commands import replay_steps

    for quiet in (False, True):
        out = io.StringIO()
        progress = progress_bar(console=terminal())
        with progress:
            step = replay_steps(Console(file=out), progress, quiet)("round_robin", 40)
            step(25)
        (task,) = progress.tasks
        assert (task.description, task.completed, task.total) == ("round_robin", 25, 40)
        assert ("replaying 40 requests" in out.getvalue()) is not quiet


def test_bench_real_steps_per_request_answered() -> None:
    from gpuroute.bench.commands import answer_steps

    progress = progress_bar(console=terminal())
    with progress:
        step = answer_steps(progress, "prefix default", 3)
        step()
        step()
    (task,) = progress.tasks
    assert (task.description, task.completed, task.total) == ("prefix default", 2, 3)


def test_the_commands_take_quiet() -> None:
    from gpuroute.cli import build_parser

    parser = build_parser()
    for command in (["capacity"], ["bench", "live"], ["bench", "real"], ["sim"], ["plan"]):
        assert parser.parse_args([*command, "--quiet"]).quiet, command
        assert parser.parse_args(command).progress == "auto", command
        assert parser.parse_args([*command, "--progress", "plain"]).progress == "plain"
