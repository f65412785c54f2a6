from __future__ import annotations

from gpuroute.router.core.outlier import OutlierDetector, OutlierSettings

IDS = ["a", "b", "c", "d"]


def detector(**kw) -> OutlierDetector:
    d = OutlierDetector(OutlierSettings(**kw))
    d.tick(0.0, IDS)
    return d


def test_consecutive_failures_eject_at_once_with_backoff() -> None:
    d = detector(consecutive_failures=3, base_ejection_s=10, max_ejection_s=25)
    assert d.record("a", False, 1.0) is None and d.record("a", False, 1.0) is None
    ejection = d.record("a", False, 1.0)
    assert (ejection.backend_id, ejection.reason, ejection.enforced, ejection.until) == (
        "a",
        "consecutive_failures",
        True,
        11.0,
    )
    assert d.tick(10.9, IDS)[1] == [] and d.tick(11.0, IDS)[1] == ["a"]
    for _ in range(3):
        ejection = d.record("a", False, 12.0)
    assert ejection.until == 12.0 + 20  # second ejection lasts twice as long
    d.tick(32.0, IDS)
    for _ in range(3):
        ejection = d.record("a", False, 33.0)
    assert ejection.until == 33.0 + 25  # capped


def test_failure_rate_is_judged_per_interval() -> None:
    d = detector(
        interval_s=10, failure_rate=0.5, failure_rate_min_requests=10, consecutive_failures=100
    )
    for i in range(20):
        d.record("b", i % 2 == 0, 1.0)  # 50 % failures, never consecutive enough
        d.record("a", True, 1.0)
    assert d.tick(5.0, IDS) == ([], [])  # interval not over yet
    ejections, _ = d.tick(10.0, IDS)
    assert [(e.backend_id, e.reason) for e in ejections] == [("b", "failure_rate")]


def test_slow_but_alive_backend_is_a_latency_outlier() -> None:
    d = detector(interval_s=10, latency_factor=3.0, latency_min_requests=5)
    for _ in range(10):
        for backend_id, ratio in (("a", 1.0), ("b", 1.2), ("c", 0.9), ("d", 4.5)):
            d.record(backend_id, True, 1.0, latency_ratio=ratio)
    ejections, _ = d.tick(10.0, IDS)
    assert [(e.backend_id, e.reason) for e in ejections] == [("d", "latency")]


def test_max_ejection_percent_caps_enforcement_but_counts_detection() -> None:
    d = detector(consecutive_failures=1, max_ejection_percent=50)
    results = [d.record(backend_id, False, 1.0) for backend_id in IDS]
    assert [r.enforced for r in results] == [True, True, False, False]
    assert (d.detected, d.enforced) == (4, 2)


def test_shadow_mode_detects_without_enforcing() -> None:
    d = detector(consecutive_failures=1, enforcing=False)
    ejection = d.record("a", False, 1.0)
    assert ejection is not None and not ejection.enforced and not d.is_ejected("a")
    assert (d.detected, d.enforced) == (1, 0)
