"""The root CLI composes what each package registers; every benchmark can run."""

from __future__ import annotations

import pytest
from gpuroute.bench.cli import BENCHES
from gpuroute.bench.commands import RUNS

from gpuroute.cli import GROUPS, build_parser


def test_every_benchmark_argument_set_has_a_run_and_no_run_is_orphaned() -> None:
    assert [b.name for b in BENCHES] == list(RUNS)


def test_each_package_registers_its_commands() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {
        "router", "explain", "admin", "usage", "global", "agent", "sim", "capacity", "plan",
        "bench", "demo", "fake-engine", "check-config", "tfvars", "scale", "scaling",
    }  # fmt: skip
    args = build_parser().parse_args(["bench", "live", "--baselines", "none"])
    assert args.baselines == "none" and callable(args.run)


def test_top_level_help_is_for_users_and_lists_every_command(capsys) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "usage: gpuroute [-h] [--version] COMMAND ..."
    assert "routes OpenAI-compatible LLM requests across GPU inference servers" in text
    for name in sub.choices:  # every command, with its help, under a named group
        line = next(line for line in text.splitlines() if line.split()[:1] == [name])
        assert len(line.split()) > 1, line
    grouped = {n for _, names in GROUPS for n in names}
    assert set(sub.choices) <= grouped, "put the new command in a group of GROUPS"
    for word in (
        "docstring",
        "composes",
        "register",
        "no logic",
        "package",
        "argparse",
        "`gpuroute` command line",
    ):
        assert word not in text.lower(), word
