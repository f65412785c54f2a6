from __future__ import annotations

import pytest
from gpuroute.router.core.ledger import OutstandingWork
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import backends

operations = st.lists(
    st.tuples(
        st.sampled_from(["start", "finish"]),
        st.integers(0, 15),  # request id
        st.integers(0, 2),  # backend index
        st.floats(0, 100, allow_nan=False),
    ),
    max_size=200,
)


@given(operations)
def test_ledger_matches_a_model(ops) -> None:
    pool = backends(3)
    ledger = OutstandingWork()
    model: dict[int, tuple[int, float]] = {}
    for op, rid, index, work in ops:
        if op == "start":
            if rid in model:
                with pytest.raises(ValueError):
                    ledger.start(rid, pool[index], work)
            else:
                ledger.start(rid, pool[index], work)
                model[rid] = (index, work)
        else:
            entry = ledger.finish(rid)
            expected = model.pop(rid, None)
            assert (entry is None) == (expected is None)
        for i, backend in enumerate(pool):
            mine = [w for b, w in model.values() if b == i]
            assert backend.in_flight == len(mine)
            assert backend.outstanding == pytest.approx(sum(mine), abs=1e-6)
            assert backend.outstanding >= -1e-9
    assert len(ledger) == len(model)


def test_idle_backend_has_exactly_zero_work() -> None:
    (backend,) = backends(1)
    ledger = OutstandingWork()
    for i, work in enumerate((0.1, 0.2, 0.7)):
        ledger.start(i, backend, work)
    for i in range(3):
        ledger.finish(i)
    assert backend.outstanding == 0.0 and backend.in_flight == 0


def test_negative_work_is_refused() -> None:
    with pytest.raises(ValueError):
        OutstandingWork().start(1, backends(1)[0], -1.0)
