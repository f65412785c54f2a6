"""The progress bar of the commands that run for minutes (`sim`, `capacity`, `bench live`,
`bench real`): on stderr, so that tables and `--json -` on stdout stay clean, and only for
a person watching (off with `--quiet`, and when stderr is no terminal: a CI log or a pipe
would fill with redraws)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(*, quiet: bool = False, console: Console | None = None) -> Progress:
    """A transient bar per task (description, bar, done of total, time so far); disabled,
    its calls do nothing."""
    console = console if console is not None else Console(stderr=True)
    return Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=quiet or not console.is_terminal,
        transient=True,
    )
