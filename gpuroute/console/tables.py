"""How commands show their results: rich tables and, optionally, matplotlib plots. One
place for both, so `gpuroute sim`, `capacity` and `bench` print and plot alike."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from gpuroute.config import ConfigError

# (key in each row, column header, format)
Columns = Sequence[tuple[str, str, str]]


def stdout_console() -> Console:
    """Stdout, wide enough for the tables when it is not a terminal (logs, CI)."""
    return Console(width=None if sys.stdout.isatty() else 160)


def print_table(console: Console, title: str, rows: Sequence[dict], columns: Columns) -> None:
    """A table of `rows` (dicts); the first column (the name) left-aligned, numbers right;
    a missing value (None) as a dash."""
    table = Table(title=title, title_justify="left")
    for i, (_, header, _) in enumerate(columns):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        cells = (("—" if row.get(key) is None else fmt.format(row[key])) for key, _, fmt in columns)
        table.add_row(*cells)
    console.print(table)


def pyplot():
    """matplotlib's pyplot on the file-only backend; ConfigError when it is not installed
    (it is optional: only --plot needs it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: .venv/bin/pip install matplotlib") from None
    return plt
