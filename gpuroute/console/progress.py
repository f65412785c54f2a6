"""Progress on the commands that run for minutes (`sim`, `capacity`, `plan`, `bench live`,
`bench real`, ...), on stderr so that tables and `--json -` on stdout stay clean:

- `bar`: a live bar, for a person at a terminal (redraws);
- `plain`: a line when a task starts, one every few seconds while it moves, and one when
  it is done, for CI logs, pipes and `tee` (a bar's redraws would fill them);
- `none`: nothing (also what `--quiet` asks);
- `auto` (the default): `bar` on a terminal, else `plain`."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich loads when progress is shown (every process builds the CLI parser)
    from rich.console import Console
    from rich.progress import Progress

MODES = ("auto", "bar", "plain", "none")
PLAIN_EVERY_S = 5.0  # a plain line at most this often per task while it moves


def add_progress(parser: argparse.ArgumentParser, quiet: str) -> None:
    """A long command's `--quiet` (what it leaves out, `quiet`) and `--progress` options."""
    parser.add_argument("--quiet", action="store_true", help=quiet)
    parser.add_argument(
        "--progress", choices=MODES, default="auto",
        help="a live bar, plain lines (CI logs, pipes) or none; auto: a bar on a terminal, "
        "else lines",
    )  # fmt: skip


def progress_bar(
    *, quiet: bool = False, console: Console | None = None, mode: str = "auto"
) -> Progress | PlainProgress:
    """Progress as `mode` says (`quiet`: none). A bar is transient: one task per line, its
    description, bar, done of total and time so far; disabled, its calls do nothing."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r}: expected one of {', '.join(MODES)}")
    console = console if console is not None else Console(stderr=True)
    if mode == "auto":
        mode = "bar" if console.is_terminal else "plain"
    if mode == "plain" and not quiet:
        return PlainProgress(console)
    return Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=quiet or mode != "bar",
        transient=True,
    )


@dataclass(slots=True)
class PlainTask:
    description: str
    total: float | None
    completed: float = 0.0
    started: float = 0.0
    said_at: float = 0.0  # when its last line was printed
    said: float = -1.0  # what that line said was completed
    finished: bool = False


class PlainProgress:
    """Progress as plain lines (`progress_bar`'s `plain`), with rich Progress's calls that
    the commands use: add_task, update, advance, tasks, and a `with` block."""

    disable = False

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.clock = console, clock
        self.tasks: list[PlainTask] = []

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_exc: object) -> None:
        for task in self.tasks:
            if not task.finished and task.completed != task.said:
                self._say(task)  # where each stopped

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        now = self.clock()
        self.tasks.append(PlainTask(description, total, started=now, said_at=now))
        self.console.print(f"{description}: started" + (f", {total:,.0f} to do" if total else ""),
                           highlight=False, markup=False)  # fmt: skip
        return len(self.tasks) - 1

    def update(self, task_id: int, *, completed: float | None = None, **_: Any) -> None:
        task = self.tasks[task_id]
        if completed is not None:
            task.completed = completed
        self._maybe_say(task)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, completed=self.tasks[task_id].completed + advance)

    def _maybe_say(self, task: PlainTask) -> None:
        done = task.total is not None and task.completed >= task.total
        if done and not task.finished:
            task.finished = True
            self._say(task)
        elif not done and self.clock() - task.said_at >= PLAIN_EVERY_S:
            self._say(task)

    def _say(self, task: PlainTask) -> None:
        now = self.clock()
        total = f" of {task.total:,.0f}" if task.total else ""
        line = f"{task.description}: {task.completed:,.0f}{total}, {now - task.started:.0f} s"
        self.console.print(line + (", done" if task.finished else ""), highlight=False,
                           markup=False)  # fmt: skip
        task.said_at, task.said = now, task.completed
