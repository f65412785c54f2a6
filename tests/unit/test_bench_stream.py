"""`bench stream`'s arithmetic: events timed as a client sees them, rows against direct."""

from __future__ import annotations

import asyncio

import pytest
from gpuroute.bench.stream import stream_rows
from gpuroute.bench.stream_client import StreamsResult, _Stream
from gpuroute.testbed.fake_engine.server import FakeEngineConfig


def _row(target: str, itl99: float, ttft: float, per_core: float | None) -> dict:
    return {
        "target": target, "streams": 10, "failed": 0, "itl_p50_ms": 50.0,
        "itl_p99_ms": itl99, "ttft_p50_ms": ttft, "events_per_core_s": per_core,
        "kib_per_stream": None if per_core is None else per_core / 1000,
    }  # fmt: skip


def test_rows_are_medians_against_direct_and_smg() -> None:
    runs = {
        ("direct", 10): [_row("direct", 51.0, 2.0, None)],
        ("gpuroute", 10): [_row("gpuroute", 52.0, 3.0, 10_000.0),
                           _row("gpuroute", 56.0, 9.0, 12_000.0),
                           _row("gpuroute", 53.0, 4.0, 14_000.0)],
        ("smg-cache-aware", 10): [_row("smg-cache-aware", 51.5, 2.5, 20_000.0)],
    }  # fmt: skip
    rows = {r["target"]: r for r in stream_rows(runs)}
    assert rows["gpuroute"]["added_itl_p99_ms"] == 2.0  # median 53 - 51
    assert rows["gpuroute"]["added_ttft_p50_ms"] == 2.0  # median 4 - 2
    assert rows["gpuroute"]["vs_smg"] == 0.6  # 12,000 / 20,000
    assert rows["direct"]["vs_smg"] is None
    assert rows["gpuroute"]["kib_per_stream"] == 14.0  # the largest heap growth (round one)


def test_a_paced_engine_needs_a_positive_interval() -> None:
    assert FakeEngineConfig(token_interval_s=0.05).token_interval_s == 0.05
    with pytest.raises(ValueError, match="token_interval_s must be > 0"):
        FakeEngineConfig(token_interval_s=0)


@pytest.mark.asyncio
async def test_events_split_or_joined_across_reads_are_counted_once() -> None:
    result = StreamsResult(1)
    done = asyncio.get_running_loop().create_future()
    stream = _Stream(b"", result, done)
    stream.data_received(b"HTTP/1.1 200 OK\r\n\r\ndata: {1}\n\nda")
    stream.data_received(b"ta: {2}\n\ndata: {3}\n\n")  # one split, one whole
    stream.data_received(b"data: [DONE]\n\n")
    assert done.done()
    assert (result.completed, result.events, len(result.ttft_s)) == (1, 3, 1)
    assert len(result.gaps_s) == 2 and result.gaps_s[1] == 0.0  # two events in one read
