"""`bench live --kill`: the streams in flight on the killed engine, those lost, and the
pause the others' clients saw (their longest silence: the continuation's), its percentiles
interpolated as every live figure's are."""

from __future__ import annotations

from gpuroute.bench.fault_report import streams_on_killed
from gpuroute.bench.loadgen import RequestResult

KILLED, OTHER = "127.0.0.1:1", "127.0.0.1:2"


def result(i: int, backend: str, sent: float, e2e: float, ok: bool, gap: float) -> RequestResult:
    return RequestResult(i, sent, ok=ok, e2e_s=e2e, backend=backend, max_gap_s=gap)


def test_only_the_streams_in_flight_on_the_killed_engine_count() -> None:
    results = [
        result(0, KILLED, 5.0, 10.0, True, 0.8),  # in flight at 10 s: continued
        result(1, KILLED, 9.0, 4.0, True, 0.4),  # continued
        result(2, KILLED, 9.5, 3.0, False, 0.0),  # lost
        result(3, KILLED, 1.0, 2.0, True, 3.0),  # over before the kill
        result(4, OTHER, 8.0, 5.0, True, 9.0),  # another engine's
        result(5, KILLED, 11.0, 1.0, True, 9.0),  # sent after it
    ]
    report = streams_on_killed(results, KILLED, 10.0)
    assert report == {"streams_in_flight": 3, "streams_lost": 1,
                      "pause_p50_s": 0.6, "pause_p99_s": 0.796}  # fmt: skip
    assert streams_on_killed([], KILLED, 10.0)["pause_p50_s"] is None
