"""The root CLI composes what each package registers; every benchmark can run."""

from __future__ import annotations

from gpuroute.bench.cli import BENCHES
from gpuroute.bench.commands import RUNS

from gpuroute.cli import build_parser


def test_every_benchmark_argument_set_has_a_run_and_no_run_is_orphaned() -> None:
    assert [b.name for b in BENCHES] == list(RUNS)


def test_each_package_registers_its_commands() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {
        "router", "explain", "global", "agent", "sim", "capacity", "bench", "demo", "fake-engine",
        "check-config", "tfvars",
    }  # fmt: skip
    args = build_parser().parse_args(["bench", "live", "--baselines", "none"])
    assert args.baselines == "none" and callable(args.run)
