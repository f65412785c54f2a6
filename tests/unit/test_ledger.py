from __future__ import annotations

import pytest
from gpuroute.router.core import BackendSet, BackendState, RequestInfo, Scheduler
from gpuroute.router.core.cost import CostEstimator
from gpuroute.router.core.ledger import OutstandingWork, WorkBooking
from gpuroute.router.core.policies.least_outstanding_work import LeastOutstandingWork
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import PRIORS, backends, life

operations = st.lists(
    st.tuples(
        st.sampled_from(["start", "finish"]),
        st.integers(0, 15),  # which request
        st.integers(0, 2),  # backend index
        st.floats(0, 100, allow_nan=False),
    ),
    max_size=200,
)


@given(operations)
def test_ledger_matches_a_model(ops) -> None:
    """Bookings start and finish in any order, a finish repeated or for a booking long
    over: each backend's sums match a model of the open bookings."""
    pool = backends(3)
    ledger = OutstandingWork()
    bookings: dict[int, WorkBooking] = {}  # the test's own request -> its latest booking
    model: dict[int, tuple[int, float]] = {}
    for op, rid, index, work in ops:
        if op == "start":
            if rid in model:
                continue  # a request holds one booking at a time (its lifetime's)
            bookings[rid] = ledger.start(pool[index], work)
            model[rid] = (index, work)
        elif rid in bookings:
            released = ledger.finish(bookings[rid])
            assert released == (model.pop(rid, None) is not None)
        for i, backend in enumerate(pool):
            mine = [w for b, w in model.values() if b == i]
            assert backend.in_flight == len(mine)
            assert backend.outstanding == pytest.approx(sum(mine), abs=1e-6)
            assert backend.outstanding >= -1e-9
    assert len(ledger) == len(model)


def test_idle_backend_has_exactly_zero_work() -> None:
    (backend,) = backends(1)
    ledger = OutstandingWork()
    booked = [ledger.start(backend, work) for work in (0.1, 0.2, 0.7)]
    for booking in booked:
        assert ledger.finish(booking)
    assert not ledger.finish(booked[0])  # a second finish changes nothing
    assert backend.outstanding == 0.0 and backend.in_flight == 0 and len(ledger) == 0


def test_negative_work_is_refused() -> None:
    with pytest.raises(ValueError):
        OutstandingWork().start(backends(1)[0], -1.0)


def test_passthrough_requests_are_booked_where_they_go() -> None:
    """An unparsed request goes to the ready backend with the fewest booked and is booked
    there at the default request's cost, so a burst alternates between equal backends; its
    release frees it, and with no ready backend nothing is booked (issue 44 item 6)."""
    pool = backends(3)
    pool[2].state = BackendState.DRAINING
    scheduler = Scheduler(BackendSet(pool), LeastOutstandingWork(), CostEstimator(PRIORS))
    lives = [life(RequestInfo(i, "", 100)) for i in range(4)]
    placed = [scheduler.route_unparsed(one) for one in lives]
    assert [b.backend_id for b in placed if b is not None] == ["b0", "b1", "b0", "b1"]
    expected = scheduler.estimator.seconds("H100", 1.0, 100, 256.0)
    assert pool[0].outstanding == pytest.approx(2 * expected) and pool[2].in_flight == 0
    assert all(scheduler.release(one) for one in lives)
    assert [(b.in_flight, b.outstanding) for b in pool] == [(0, 0.0)] * 3
    for b in pool[:2]:
        b.state = BackendState.WARMING
    nowhere = life(RequestInfo(9, "", 100))
    assert scheduler.route_unparsed(nowhere) is None and nowhere.work is None
