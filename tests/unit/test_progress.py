"""Progress on long commands (issue 34, item 6): a bar on a terminal, none with `--quiet` or
when stderr is a file or a pipe; `capacity` steps once per load it runs, `bench live` and
`bench real` once per request."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from gpuroute.console.progress import progress_bar


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=100)


def test_a_bar_only_for_a_person_at_a_terminal() -> None:
    assert not progress_bar(console=terminal()).disable
    assert progress_bar(quiet=True, console=terminal()).disable
    assert progress_bar(console=Console(file=io.StringIO())).disable  # a file, a pipe, CI


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
    for command in (["capacity"], ["bench", "live"], ["bench", "real"], ["sim"]):
        assert parser.parse_args([*command, "--quiet"]).quiet, command
