"""A pool's smoothed arrival rate (router/core/autoscale.py ArrivalRate): what the router
sizes with and shows on /admin/autoscale."""

from __future__ import annotations

from gpuroute.router.core.autoscale import ArrivalRate


def test_a_pools_rate_after_a_burst_falls_to_zero_never_below() -> None:
    rate = ArrivalRate(window_s=2, trend_window_s=4)
    rate.update(0.0)
    for tick in range(1, 25):  # 6 requests/s for 12 s, ticked every 0.5 s
        rate.arrive(3)
        rate.update(tick * 0.5)
    assert rate.rate > 5
    lowest = min(rate.update(12 + tick * 0.5) for tick in range(1, 40))  # then nothing
    assert lowest == 0.0 and rate.ahead(2) == 0.0
