"""The global tier's pure core: residency, region health, spillover, the decision."""

from __future__ import annotations

import csv
import random

import pytest
from gpuroute.global_.core.geo import (
    RTT_BASE_MS,
    RTT_MS_PER_KM,
    Point,
    estimated_rtt_s,
    fit_rtt,
    great_circle_km,
)
from gpuroute.global_.core.policy import GlobalPolicy, GlobalRequest, RegionView
from gpuroute.global_.core.region_health import RegionHealth, RegionHealthSettings, RegionState
from gpuroute.global_.core.residency import ANY, Allowed, ResidencyError, ResidencyRules
from gpuroute.global_.core.spillover import Spillover, SpillSettings
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paths import shared_file

WASHINGTON, FRANKFURT, TOKYO = Point(38.9, -77.0), Point(50.1, 8.7), Point(35.7, 139.7)
LONDON, BERLIN = Point(51.5, -0.13), Point(52.5, 13.4)


def regions(**up: bool) -> list[RegionView]:
    specs = {"us-east": ("us", WASHINGTON), "eu-west": ("eu", FRANKFURT), "ap-ne": ("jp", TOKYO)}
    return [
        RegionView(name, j, loc, up.get(name.replace("-", "_"), True))
        for name, (j, loc) in specs.items()
    ]


RULES = ResidencyRules(
    jurisdictions=frozenset({"us", "eu", "jp"}),
    tenants={"acme-eu": frozenset({"eu"}), "globex": frozenset({"us", "eu"})},
    countries={"DE": frozenset({"eu"}), "FR": frozenset({"eu"})},
)


# -- residency -----------------------------------------------------------------------------
def test_rules_intersect_and_name_themselves() -> None:
    assert RULES.allowed() == Allowed(ANY, ())
    assert RULES.allowed(tenant="globex", country="DE") == Allowed(
        frozenset({"eu"}), ("tenant globex", "country DE")
    )
    conflict = RULES.allowed(tenant="acme-eu", header="us")
    assert conflict.empty and conflict.rules == ("tenant acme-eu", "header us")
    assert RULES.allowed(header="EU, jp").jurisdictions == frozenset({"eu", "jp"})
    assert RULES.allowed(country="US").jurisdictions is ANY  # no rule for US clients


def test_unknown_header_value_is_an_error_not_anywhere() -> None:
    for value in ("mars", "", " , ", "eu,xx"):
        with pytest.raises(ResidencyError, match="unknown jurisdiction"):
            RULES.allowed(header=value)


def test_unknown_country_default_and_fail_closed_option() -> None:
    assert RULES.allowed(country=None).jurisdictions is ANY
    closed = ResidencyRules(RULES.jurisdictions, countries=RULES.countries,
                            unknown_country=frozenset({"eu"}))  # fmt: skip
    assert closed.allowed(country=None) == Allowed(frozenset({"eu"}), ("unknown country",))


def test_rule_problems_are_reported_by_key() -> None:
    bad = ResidencyRules(
        frozenset({"us", "eu"}),
        tenants={"t1": frozenset({"mars"}), "t2": frozenset()},
        countries={"germany": frozenset({"eu"})},
        unknown_country=frozenset({"moon"}),
    )
    assert bad.check() == [
        "residency.tenants.t1: unknown jurisdiction 'mars'",
        "residency.tenants.t2: empty list (would refuse all)",
        "residency.unknown_country: unknown jurisdiction 'moon'",
        "residency.countries.germany: use ISO 3166 alpha-2, e.g. DE",
    ]
    assert RULES.check() == []


# -- geo -------------------------------------------------------------------------------------
def test_great_circle_and_rtt_estimate() -> None:
    assert great_circle_km(WASHINGTON, FRANKFURT) == pytest.approx(6530, rel=0.01)
    assert great_circle_km(LONDON, LONDON) == 0
    assert estimated_rtt_s(WASHINGTON, FRANKFURT) == pytest.approx(
        (RTT_BASE_MS + RTT_MS_PER_KM * great_circle_km(WASHINGTON, FRANKFURT)) / 1000
    )
    assert fit_rtt([(0, 5), (100, 7), (200, 9)]) == pytest.approx((5.0, 0.02))


IBM_CITIES = {
    "Dallas": (32.78, -96.80), "Toronto": (43.65, -79.38), "Washington DC": (38.9, -77.04),
    "Frankfurt": (50.11, 8.68), "London": (51.51, -0.13), "Madrid": (40.42, -3.70),
    "Montreal": (45.50, -73.57), "Chennai": (13.08, 80.27), "Mumbai": (19.08, 72.88),
    "Osaka": (34.69, 135.50), "Sydney": (-33.87, 151.21), "Tokyo": (35.68, 139.69),
    "Sao Paulo": (-23.55, -46.63),
}  # fmt: skip


@pytest.mark.shared_data
def test_rtt_constants_are_the_fit_to_the_measured_matrix() -> None:
    path = shared_file("ibm-cloud-rtt/ibm_cloud_inter_region_rtt_ms_latest.csv")
    rows = list(csv.reader(path.open()))
    pairs = []
    for row in rows[1:]:
        for city, value in zip(rows[0][1:], row[1:], strict=True):
            if value:
                d = great_circle_km(Point(*IBM_CITIES[row[0]]), Point(*IBM_CITIES[city]))
                pairs.append((d, float(value)))
    base, per_km = fit_rtt(pairs)
    assert base == pytest.approx(RTT_BASE_MS, abs=0.5)
    assert per_km == pytest.approx(RTT_MS_PER_KM, rel=0.02)
    errors = sorted(abs(RTT_BASE_MS + RTT_MS_PER_KM * d - r) / r for d, r in pairs)
    assert errors[len(errors) // 2] < 0.2  # median relative error of the model


# -- region health ----------------------------------------------------------------------------
def test_region_health_goes_down_on_stale_or_failures_and_back_with_probation() -> None:
    h = RegionHealth(RegionHealthSettings(stale_after_s=2, down_after_failures=3, up_after_s=5))
    assert h.state is RegionState.UNKNOWN and h.tick(0.0) is None
    assert h.report(0.0) is RegionState.UP
    h.report(1.0)
    assert h.tick(2.9) is None
    assert h.tick(3.1) is RegionState.DOWN
    assert h.report(4.0) is RegionState.RECOVERING and not h.up
    h.report(8.0)
    assert h.tick(8.5) is None  # 4.5 s of probation
    h.report(9.0)
    assert h.tick(9.1) is RegionState.UP
    assert [h.forwarded(False, 10.0) for _ in range(3)] == [None, None, RegionState.DOWN]
    assert h.forwarded(True, 11.0) is None and h.state is RegionState.DOWN


# -- spillover ---------------------------------------------------------------------------------
def test_spill_hysteresis_and_fraction() -> None:
    s = Spillover(SpillSettings(start=0.85, stop=0.75, full=1.0, max_fraction=0.9))
    assert [s.update("r", u) for u in (0.5, 0.84, 0.86, 0.8, 0.76, 0.74, 0.8)] == [
        False, False, True, True, True, False, False,
    ]  # fmt: skip
    s.update("r", 0.95)
    assert s.fraction("r") == pytest.approx((0.95 - 0.75) / 0.25 * 0.9)
    s.update("r", 1.4)
    assert s.fraction("r") == 0.9 and not s.can_receive("r")


def test_spill_share_matches_the_fraction_statistically() -> None:
    spill = Spillover()
    spill.update("us-east", 0.95)
    policy = GlobalPolicy("ours", spill)
    rng = random.Random(3)
    req = GlobalRequest("m", Allowed(ANY), WASHINGTON)
    n = 20_000
    moved = sum(policy.decide(req, regions(), rng).region != "us-east" for _ in range(n))
    expected = spill.fraction("us-east")
    assert abs(moved / n - expected) < 4 * (expected * (1 - expected) / n) ** 0.5


def test_spill_skips_a_receiver_that_is_spilling_itself() -> None:
    spill = Spillover(SpillSettings(max_fraction=1.0))
    spill.update("us-east", 1.0)  # sends everything on
    spill.update("eu-west", 0.9)  # cannot receive
    d = GlobalPolicy("ours", spill).decide(
        GlobalRequest("m", Allowed(ANY), WASHINGTON), regions(), random.Random(1)
    )
    assert d.region == "ap-ne" and d.reason == "spill"


# -- decisions -----------------------------------------------------------------------------------
def test_nearest_latency_failover_hint_and_refusals() -> None:
    rng = random.Random(0)
    eu = Allowed(frozenset({"eu"}), ("tenant acme-eu",))
    ours = GlobalPolicy("ours")
    d = ours.decide(GlobalRequest("m", Allowed(ANY), LONDON), regions(), rng)
    assert d.order == ("eu-west", "us-east", "ap-ne") and d.reason == "latency"
    d = ours.decide(GlobalRequest("m", Allowed(ANY), LONDON), regions(eu_west=False), rng)
    assert d.order == ("us-east", "ap-ne") and d.reason == "failover"
    d = ours.decide(GlobalRequest("m", eu, WASHINGTON), regions(), rng)
    assert d.order == ("eu-west",)  # residency beats distance; nothing else to retry on
    d = ours.decide(GlobalRequest("m", eu, WASHINGTON), regions(eu_west=False), rng)
    assert d.order == () and d.reason == "region_unavailable" and d.rules == ("tenant acme-eu",)
    jp_only = Allowed(frozenset({"jp"}), ("header jp",))
    d = ours.decide(GlobalRequest("m", jp_only, LONDON, hint="eu-west"), regions(), rng)
    assert d.order == ("ap-ne",) and d.reason == "latency"  # a hint outside the rules: ignored
    d = ours.decide(GlobalRequest("m", Allowed(ANY), LONDON, hint="ap-ne"), regions(), rng)
    assert d.order[0] == "ap-ne" and d.reason == "hint"
    nothing = Allowed(frozenset(), ("tenant acme-eu", "header us"))
    d = ours.decide(GlobalRequest("m", nothing, LONDON), regions(), rng)
    assert d.order == () and d.reason == "residency" and d.rules == nothing.rules


def fleet(**spec: tuple[bool, set[str], set[str]]) -> list[RegionView]:
    """Regions as (up, models served now, models known) by name."""
    where = {"us_east": ("us", WASHINGTON), "eu_west": ("eu", FRANKFURT), "ap_ne": ("jp", TOKYO)}
    return [
        RegionView(name, where[name][0], where[name][1], up, 0.0, frozenset(m), frozenset(k))
        for name, (up, m, k) in spec.items()
    ]


EU = Allowed(frozenset({"eu"}), ("tenant acme-eu",))


@pytest.mark.parametrize(
    ("allowed", "regions_", "model", "reason"),
    [
        # nobody anywhere knows it, with or without rules: the model, not residency
        (Allowed(ANY), fleet(us_east=(True, {"a"}, {"a"})), "b", "model_not_found"),
        (EU, fleet(eu_west=(True, {"a"}, {"a"})), "b", "model_not_found"),
        # rules that leave no jurisdiction: residency, whatever the model
        (Allowed(frozenset(), ("x",)), fleet(us_east=(True, {"a"}, {"a"})), "b", "residency"),
        # only a region the rules forbid knows it: residency
        (EU, fleet(us_east=(True, {"b"}, {"b"}), eu_west=(True, {"a"}, {"a"})), "b", "residency"),
        # allowed regions know it, none has an engine for it in rotation: no_backend
        (EU, fleet(eu_west=(True, set(), {"b"}), us_east=(True, {"b"}, {"b"})), "b", "no_backend"),
        (Allowed(ANY), fleet(eu_west=(False, set(), {"b"})), "b", "no_backend"),
        # an allowed region serves it and is down: region_unavailable
        (EU, fleet(eu_west=(False, {"b"}, {"b"}), us_east=(True, {"b"}, {"b"})), "b",
         "region_unavailable"),
    ],
)  # fmt: skip
def test_a_refusal_names_its_true_reason(allowed, regions_, model, reason) -> None:
    d = GlobalPolicy("ours").decide(GlobalRequest(model, allowed), regions_, random.Random(0))
    assert d.order == () and d.reason == reason


def test_a_region_that_reports_no_known_models_is_judged_by_what_it_serves() -> None:
    """A router from before the field: known None, what it serves is all it knows."""
    old = [RegionView("us-east", "us", WASHINGTON, True, 0.0, frozenset({"a"}), None)]
    d = GlobalPolicy("ours").decide(GlobalRequest("b", Allowed(ANY)), old, random.Random(0))
    assert d.reason == "model_not_found"
    d = GlobalPolicy("ours").decide(GlobalRequest("a", Allowed(ANY)), old, random.Random(0))
    assert d.order == ("us-east",)


def test_queueing_delay_moves_latency_ranking_but_not_nearest() -> None:
    busy = [
        RegionView("eu-west", "eu", FRANKFURT, True, queue_delay_s=0.5),
        RegionView("us-east", "us", WASHINGTON, True, queue_delay_s=0.0),
    ]
    req = GlobalRequest("m", Allowed(ANY), BERLIN)
    assert GlobalPolicy("latency").decide(req, busy, random.Random()).region == "us-east"
    assert GlobalPolicy("nearest").decide(req, busy, random.Random()).region == "eu-west"


def test_regions_not_serving_the_model_are_skipped() -> None:
    views = [
        RegionView("eu-west", "eu", FRANKFURT, True, models=frozenset({"other"})),
        RegionView("us-east", "us", WASHINGTON, True, models=frozenset({"m"})),
    ]
    d = GlobalPolicy().decide(GlobalRequest("m", Allowed(ANY), BERLIN), views, random.Random())
    assert d.order == ("us-east",)


JURISDICTIONS = ("us", "eu", "jp", "in")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(JURISDICTIONS), st.booleans(), st.floats(0, 2)),
        min_size=1, max_size=8,
    ),
    st.frozensets(st.sampled_from(JURISDICTIONS)),
    st.sampled_from(("ours", "latency", "nearest")),
    st.one_of(st.none(), st.integers(0, 7)),
    st.integers(0, 2**32),
)  # fmt: skip
def test_no_path_ever_leaves_the_allowed_jurisdictions(specs, allowed_set, mode, hint, seed):
    spill = Spillover()
    views = []
    for i, (jurisdiction, up, util) in enumerate(specs):
        name = f"r{i}"
        spill.update(name, util)
        views.append(RegionView(name, jurisdiction, Point(10.0 * i, 20.0 * i), up))
    allowed = Allowed(allowed_set, ("rule",))
    request = GlobalRequest("m", allowed, Point(0, 0), hint=None if hint is None else f"r{hint}")
    decision = GlobalPolicy(mode, spill).decide(request, views, random.Random(seed))
    by_name = {v.name: v for v in views}
    assert all(by_name[n].jurisdiction in allowed_set for n in decision.order)
    assert all(by_name[n].up for n in decision.order)
    assert len(set(decision.order)) == len(decision.order)
    compliant_up = {v.name for v in views if v.jurisdiction in allowed_set and v.up}
    assert set(decision.order) == compliant_up  # every compliant region stays retryable
    assert (decision.region is None) == (not compliant_up)


TIMING = ("p50_us", "p99_us", "p999_us", "mean_us")


def test_decision_benchmark_times_every_decision_of_both_policies() -> None:
    """The report's rows, against what the test asked for (6 regions, 300 decisions) and
    the baseline's own ratio (1 exactly); the timing itself is `bench global`'s to show."""
    from gpuroute.bench.global_decisions import run_global_bench

    report = run_global_bench(n_regions=6, decisions=300)
    assert report["regions"] == 6
    rows = report["rows"]
    assert [(r["policy"], r["decisions"]) for r in rows] == [("nearest", 300), ("ours", 300)]
    assert all(0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"] for r in rows)
    assert all(set(r) == {"policy", "decisions", *TIMING, "p99_vs_nearest"} for r in rows)
    assert rows[0]["p99_vs_nearest"] == 1.0


def test_decision_timing_is_one_sample_per_request_and_numpys_percentiles() -> None:
    """`time_decisions` asks the policy once per request, in order, and `timing_row`'s
    percentiles are numpy's over those samples: checked on a policy that records its calls
    and on samples whose percentiles are known."""
    import numpy as np
    from gpuroute.bench.global_decisions import time_decisions, timing_row

    class Recording:
        def __init__(self) -> None:
            self.asked: list[GlobalRequest] = []

        def decide(self, request, views, rng) -> None:
            self.asked.append(request)

    reqs = [GlobalRequest("m", Allowed(ANY), Point(float(i), 0.0)) for i in range(50)]
    policy = Recording()
    samples = time_decisions(policy, regions(), reqs, random.Random(1))
    assert policy.asked == reqs and samples.shape == (50,) and (samples >= 0).all()
    row = timing_row(np.arange(1.0, 102.0))  # 1 .. 101 µs
    assert row == pytest.approx(
        {"p50_us": 51.0, "p99_us": 100.0, "p999_us": 100.9, "mean_us": 51.0}
    )


def test_the_region_reports_p99_is_the_one_percentile() -> None:
    """Issue 44 item 7: interpolated, as the simulator's (it was nearest-rank: 99.0 here)."""
    from gpuroute.router.core.region_summary import RegionSummary
    from gpuroute.router.observe.region_report import RegionReportService

    recent = [float(i) for i in range(1, 101)], [5.0]
    summary = RegionSummary(0.5, 0.0, 1, 1.0, ("m",))
    report = RegionReportService("r", lambda: summary, lambda: 0, 1.0, lambda: recent).report()
    assert report.ttft_p99_s == pytest.approx(99.01) and report.e2e_p99_s == 5.0
    empty = RegionReportService("r", lambda: summary, lambda: 0, 1.0).report()
    assert (empty.ttft_p99_s, empty.e2e_p99_s) == (0.0, 0.0)
