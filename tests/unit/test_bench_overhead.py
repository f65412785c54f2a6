"""`bench overhead`'s rows: medians, what each proxy adds over direct, and requests per
proxy core-second against HAProxy's (the engine's core may be what saturates)."""

from __future__ import annotations

import pytest
from gpuroute.bench.overhead import observability_cost, overhead_rows, swapped


def run(rps: float, p50: float, p99: float, cores: float | None = None) -> dict[str, float]:
    out = {"rps": rps, "p50_ms": p50, "p99_ms": p99, "non_2xx": 0}
    if cores is not None:
        out["proxy_cores"] = cores
    return out


def test_rows_compare_each_proxy_with_direct_and_with_haproxy_per_core() -> None:
    samples = {
        ("direct", 32): [run(8000, 4.0, 5.0), run(8200, 3.8, 5.2), run(7900, 4.1, 4.9)],
        ("gpuroute", 32): [run(5000, 6.0, 9.0, 1.0), run(5100, 6.2, 9.4, 0.98)],
        ("haproxy", 32): [run(6000, 5.0, 8.0, 0.25), run(5800, 5.2, 8.2, 0.25)],
    }
    rows = {r["target"]: r for r in overhead_rows(samples)}
    assert [r["target"] for r in overhead_rows(samples)] == ["direct", "gpuroute", "haproxy"]
    ours, haproxy, direct = rows["gpuroute"], rows["haproxy"], rows["direct"]
    assert direct["rps"] == 8000 and "rps_per_core" not in direct
    assert ours["added_p50_ms"] == pytest.approx(6.1 - 4.0)
    assert ours["added_p99_ms"] == pytest.approx(9.2 - 5.0)
    assert ours["rps_vs_haproxy"] == pytest.approx(5050 / 5900, abs=1e-3)
    assert ours["rps_per_core"] == pytest.approx(5050 / 0.99, abs=0.1)
    assert haproxy["rps_per_core"] == pytest.approx(5900 / 0.25, abs=0.1)
    assert ours["per_core_vs_haproxy"] == pytest.approx((5050 / 0.99) / (5900 / 0.25), abs=1e-3)


def test_tracing_and_logging_cost_is_on_against_off_from_the_same_rounds() -> None:
    samples = {}
    for connections, scale in ((1, 1.0), (32, 10.0)):
        samples[("direct", connections)] = [run(1000 * scale, 1.0, 2.0)]
        samples[("haproxy", connections)] = [run(900 * scale, 1.1, 2.2, 0.2)]
        samples[("gpuroute-quiet", connections)] = [run(800 * scale, 1.2, 2.4, 1.0)]
        samples[("gpuroute-observed", connections)] = [run(600 * scale, 1.5, 3.0, 1.0)]
        samples[("gpuroute-sampled", connections)] = [run(760 * scale, 1.25, 2.5, 1.0)]
    cost = {(c["target"], c["connections"]): c for c in observability_cost(overhead_rows(samples))}
    assert sorted(cost) == [
        ("gpuroute-observed", 1), ("gpuroute-observed", 32),
        ("gpuroute-sampled", 1), ("gpuroute-sampled", 32),
    ]  # fmt: skip
    every = cost[("gpuroute-observed", 32)]
    assert every["rps_on_vs_off"] == pytest.approx(0.75)
    assert every["per_core_on_vs_off"] == pytest.approx(0.75)
    assert cost[("gpuroute-observed", 1)]["added_p50_ms"] == pytest.approx(0.3)
    assert cost[("gpuroute-observed", 1)]["added_p99_ms"] == pytest.approx(0.6)
    assert cost[("gpuroute-sampled", 32)]["rps_on_vs_off"] == pytest.approx(0.95)


def test_a_before_and_after_take_turns_at_going_first() -> None:
    turn = [("direct", "d"), ("gpuroute", "n"), ("haproxy", "h"), ("gpuroute-other", "o")]
    assert [n for n, _ in swapped(turn, "gpuroute", "gpuroute-other")] == [
        "direct", "gpuroute-other", "haproxy", "gpuroute",
    ]  # fmt: skip
    assert swapped(turn[:3], "gpuroute", "gpuroute-other") == turn[:3]
