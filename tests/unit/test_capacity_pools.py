"""`gpuroute capacity` judges each model's pool on its own (issue 45: a fleet-wide share of
requests in SLO hid an 8B pool meeting 0.835 at the load reported as capacity)."""

from __future__ import annotations

from types import SimpleNamespace

from gpuroute.sim.capacity import CapacitySearch


class TwoPools:
    """A fleet whose big pool (90 % of requests) meets its SLO up to 1.0 of nominal load and
    whose small 8B pool only up to 0.5: fleet-wide, 0.9 or more up to 1.0."""

    rate_rps = 10.0

    def __init__(self, utilization: float = 1.0) -> None:
        self.utilization = utilization

    def at_utilization(self, utilization: float) -> TwoPools:
        return TwoPools(utilization)

    def run(self, _policy: str):
        big = 1.0 if self.utilization <= 1.0 else 0.5
        small = 1.0 if self.utilization <= 0.5 else 0.8
        by_model = {
            "70b": {"request_share": 0.9, "attainment": big},
            "8b": {"request_share": 0.1, "attainment": small},
            "unused": {"request_share": 0.0, "attainment": float("nan")},
        }
        return SimpleNamespace(
            slo_attainment=0.9 * big + 0.1 * small, goodput_rps=1.0, by_model=by_model
        )


def test_the_capacity_is_where_every_pool_meets_the_target_and_the_one_that_misses_is_named():
    result = CapacitySearch(TwoPools(), "round_robin", 0.9).result()
    assert 0.45 < result.slo_capacity_utilization <= 0.5  # not ~1.0, the fleet-wide figure
    assert result.limited_by == ["8b"]
    assert result.to_dict()["limited_by"] == ["8b"]


def test_a_single_model_fleet_is_judged_as_before_and_its_json_unchanged():
    class One(TwoPools):
        def run(self, _policy: str):
            met = 1.0 if self.utilization <= 0.6 else 0.5
            return SimpleNamespace(slo_attainment=met, goodput_rps=1.0, by_model={})

        def at_utilization(self, utilization: float) -> One:
            return One(utilization)

    result = CapacitySearch(One(), "round_robin", 0.9).result()
    assert 0.55 < result.slo_capacity_utilization <= 0.6
    assert "limited_by" not in result.to_dict() and "by_model_at_capacity" not in result.to_dict()
