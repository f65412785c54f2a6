"""The pieces of `router --workers`: the shared-memory board, the merged admin answers,
and every local limit split so that the workers together never exceed it."""

from __future__ import annotations

import os

import msgpack
import pytest
from gpuroute.router.config.auth import AuthConfig
from gpuroute.router.config.redis import RedisConfig
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.policies.prefix_affinity import PrefixIndex
from gpuroute.router.shared.load import PREFIXES_KEY, SharedLoad
from gpuroute.router.shared.quotas import Quotas
from gpuroute.router.workers.admin import merge_backends, merge_metrics
from gpuroute.router.workers.board import (
    HEADER,
    ROW_BYTES,
    BoardFull,
    MemoryBoard,
    create_board,
)
from gpuroute.router.workers.parent import resolve_count
from prometheus_client.parser import text_string_to_metric_families


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def boards(tmp_path):
    path = tmp_path / "load.board"
    create_board(path, 3)
    clock = Clock()
    made = [MemoryBoard(path, i, 3, fresh_s=1.0, clock=clock) for i in range(3)]
    yield made, clock
    for board in made:
        board.close()


@pytest.mark.asyncio
async def test_each_worker_reads_the_fresh_rows_of_the_others(boards) -> None:
    (a, b, c), clock = boards
    assert await a.exchange(msgpack.packb({"x": 1.0})) == []  # nobody else wrote yet
    await b.exchange(msgpack.packb({"x": 2.5}))
    rows = await c.exchange(msgpack.packb({}))
    assert sorted(msgpack.unpackb(r)["x"] for r in rows if msgpack.unpackb(r)) == [1.0, 2.5]
    assert c.peers == 2
    clock.now += 0.9
    await b.exchange(msgpack.packb({"x": 3.0}))
    clock.now += 0.2  # a's row is now 1.1 s old: a dead worker's share goes quiet
    rows = await c.exchange(msgpack.packb({}))
    assert [msgpack.unpackb(r) for r in rows] == [{"x": 3.0}]


def test_a_row_being_written_is_never_read(boards) -> None:
    (a, b, _), _clock = boards
    a.publish(b"whole")
    assert b.read(0) == (100.0, b"whole")
    HEADER.pack_into(a.map, 0, a.sequence + 1, 100.0, 5)  # odd: a writer is mid-row
    assert b.read(0) is None
    assert b.read(2) is None  # never written


def test_a_share_too_big_for_its_row_is_refused(boards) -> None:
    (a, _, _), _clock = boards
    with pytest.raises(BoardFull):
        a.publish(b"x" * ROW_BYTES)


def test_metrics_of_all_workers_are_merged_with_a_worker_label() -> None:
    text = (
        "# HELP gpuroute_requests_total Requests.\n# TYPE gpuroute_requests_total counter\n"
        'gpuroute_requests_total{code="200"} 3.0\n'
    )
    merged = merge_metrics([text, None, text.replace("3.0", "4.0")]).decode()
    samples = {
        s.labels["worker"]: s.value
        for f in text_string_to_metric_families(merged)
        for s in f.samples
        if s.name == "gpuroute_requests_total"
    }
    assert samples == {"0": 3.0, "2": 4.0}
    assert merged.count("# TYPE gpuroute_requests_total counter") == 1


def test_backend_views_sum_what_each_worker_booked() -> None:
    def view(in_flight: int, work: float) -> dict:
        row = {"id": "b", "in_flight": in_flight, "outstanding_s": work, "state": "ready"}
        return {"policy": "p", "backends": [row]}

    merged = merge_backends([view(2, 1.5), None, view(3, 0.25)])
    assert merged["backends"] == [
        {"id": "b", "in_flight": 5, "outstanding_s": 1.75, "state": "ready"}
    ]
    assert merged["policy"] == "p"
    assert [w and w["worker"] for w in merged["workers"]] == [0, None, 2]


def test_auto_is_one_worker_per_usable_core() -> None:
    assert resolve_count("auto") == len(os.sched_getaffinity(0))
    assert resolve_count(3) == 3


def test_local_limits_are_split_across_workers() -> None:
    auth = AuthConfig.model_validate(
        {
            "keys": [
                {"tenant": "t", "sha256": "a" * 64, "requests_per_minute": 60, "max_in_flight": 5}
            ],
            "anonymous": {"max_in_flight": 1},
        }
    )
    quotas = Quotas.from_config(auth, RedisConfig(), None, Clock(), lambda _s: None, workers=2)
    assert quotas.keys["a" * 64].max_in_flight == 2  # 2 + 2 <= 5
    assert quotas.anonymous.max_in_flight == 1  # never below one
    assert quotas.local_fraction == 0.5


@pytest.mark.asyncio
async def test_workers_learn_each_others_prefix_placements_once(boards) -> None:
    """Worker a placed a conversation's blocks on e1; b, which never saw that
    conversation, finds them there after one exchange each. What b placed comes back to a,
    and nothing is learned twice or echoed back as b's own."""
    (a_board, b_board, _), _clock = boards
    pool = [Backend("e1", "A100", ["m"]), Backend("e2", "A100", ["m"])]
    indexes = [PrefixIndex(), PrefixIndex()]
    a, b = (
        SharedLoad(board, lambda: pool, prefixes=lambda i=index: i)
        for board, index in zip((a_board, b_board), indexes, strict=True)
    )
    conversation, other = (1, 2, 3, 4), (9, 8)
    indexes[0].record(conversation, "e1")
    await a.sync()
    await b.sync()
    assert indexes[1].matches(conversation) == {"e1": 4}
    assert indexes[1].recent() == []  # learned, not placed: b does not pass it on
    indexes[1].record(other, "e2")
    indexes[0].record(conversation, "e2")  # a moved the conversation since
    await b.sync()
    await a.sync()
    assert indexes[0].matches(other) == {"e2": 2}
    assert indexes[0].matches(conversation) == {"e2": 4}  # b's stale view did not win
    await b.sync()
    assert indexes[1].matches(conversation) == {"e2": 4}


@pytest.mark.asyncio
async def test_a_garbled_prefix_share_is_skipped(boards) -> None:
    (a_board, b_board, _), _clock = boards
    index = PrefixIndex()
    b = SharedLoad(b_board, lambda: [], prefixes=lambda: index)
    for garbled in (["peer", [[1, "e1"]]], ["peer", [["x", "e1", [5]]]], "peer", [1, 2]):
        await a_board.exchange(msgpack.packb({PREFIXES_KEY: garbled}))
        await b.sync()
    assert len(index) == 0
    await a_board.exchange(msgpack.packb({PREFIXES_KEY: ["peer", [[1, "e1", [5, 6]]]]}))
    await b.sync()
    assert index.matches([5, 6]) == {"e1": 2}
