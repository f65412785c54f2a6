"""The benchmarks' tables, printed with rich (the JSON has the same numbers)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gpuroute.console.tables import print_table

__all__ = ["GLOBAL_COLUMNS", "LIVE_COLUMNS", "print_fleet", "print_live_notes", "print_table"]

LIVE_COLUMNS = (
    ("target", "target", "{}"),
    ("completed", "done", "{:,}"),
    ("failed", "fail", "{:,}"),
    ("ttft_p50_s", "TTFT p50", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99", "{:.3f}"),
    ("e2e_p50_s", "E2E p50", "{:.2f}"),
    ("e2e_p99_s", "E2E p99", "{:.2f}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("goodput_rps", "goodput", "{:.2f}"),
)

GLOBAL_COLUMNS = (
    ("policy", "target", "{}"),
    ("decisions", "decisions", "{:,}"),
    ("p50_us", "p50 µs", "{:.1f}"),
    ("p99_us", "p99 µs", "{:.1f}"),
    ("p999_us", "p99.9 µs", "{:.1f}"),
    ("p99_vs_nearest", "p99 ÷ nearest", "{:.2f}"),
)


def print_fleet(console: Console, r: dict) -> None:
    table = Table(title=f"fleet membership: {r['hosts']} agents, one router, Consul dev agent")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("load staleness p50 / p99 / max (s)",
         f"{r['staleness_p50_s']:.3f} / {r['staleness_p99_s']:.3f} / {r['staleness_max_s']:.3f}"),
        ("staleness samples", f"{r['staleness_samples']:,}"),
        ("Consul Raft writes (steady)", f"{r['raft_writes']} in {r['steady_seconds']:.0f} s"),
        ("Consul Raft writes / s", f"{r['raft_writes_per_s']:.3f}"),
        ("requests ok / failed", f"{r['requests_ok']:,} / {r['requests_failed']:,}"),
    ]  # fmt: skip
    if o := r.get("outage"):
        rows += [
            (f"Consul outage {o['seconds']:.0f} s: served / failed",
             f"{o['served_during']:,} / {o['failed']:,}"),
            ("router caught up after restart (s)", f"{o['router_recovered_s']:.2f}"),
            ("all agents registered again (s)", f"{o['agents_registered_s']:.2f}"),
        ]  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_live_notes(console: Console, targets: list[dict]) -> None:
    """What a live table cannot show: utilisation spread, faults, the Redis outage."""
    for target in targets:
        if "gpu_util_cv" in target:
            console.print(
                f"{target['target']}: GPU utilisation (work, as in the simulator) mean "
                f"{target['gpu_util_mean']}, CV {target['gpu_util_cv']}; busy share CV "
                f"{target['gpu_busy_cv']}"
            )
        for fault in target.get("faults", []):
            console.print(f"{target['target']} fault: {fault}")
        if "continuations" in target:
            console.print(f"{target['target']} stream continuations: {target['continuations']}")
        if "redis_killed_at_s" in target:
            console.print(
                f"Redis killed at {target['redis_killed_at_s']} s, restarted at "
                f"{target['redis_restarted_at_s']} s; failed requests: {target['failed']}"
            )
