from __future__ import annotations

import asyncio

import pytest
from gpuroute.router.attempts.exchange import RequestState
from gpuroute.router.config.router import AdmissionConfig
from gpuroute.router.core.admission import Admission, AdmissionQueue, AdmissionSettings, Verdict
from gpuroute.router.core.backend import Backend, BackendSet, BackendState
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.request import RequestInfo
from gpuroute.router.core.standby import PROMOTED, StandbyRotation
from gpuroute.router.front.admission import AdmissionGate
from gpuroute.router.observe.metrics import RouterMetrics
from hypothesis import given
from hypothesis import strategies as st


def queue(**kw) -> AdmissionQueue:
    return AdmissionQueue(AdmissionSettings(**kw))


def test_admits_when_there_is_room_and_nobody_waits() -> None:
    assert queue().offer("r1", "normal", 0.0, has_capacity=True).verdict is Verdict.ADMIT


def test_queues_without_capacity_and_drains_by_priority_then_age() -> None:
    q = queue()
    for item, priority in (("n1", "normal"), ("l1", "low"), ("h1", "high"), ("n2", "normal")):
        assert q.offer(item, priority, 0.0, has_capacity=False).verdict is Verdict.QUEUED
    # Room again, but a newcomer must not overtake equal-or-higher priority waiters.
    assert q.offer("n3", "normal", 0.1, has_capacity=True).verdict is Verdict.QUEUED
    order = [q.pop_ready(1.0)[0] for _ in range(5)]
    assert order == ["h1", "n1", "n2", "n3", "l1"]
    assert q.pop_ready(1.0) == (None, [])


def test_full_queue_sheds_lowest_priority_first() -> None:
    q = queue(max_queue=2)
    q.offer("l1", "low", 0.0, has_capacity=False)
    q.offer("n1", "normal", 0.0, has_capacity=False)
    offer = q.offer("h1", "high", 0.0, has_capacity=False)
    assert offer.verdict is Verdict.QUEUED
    assert [(s.item, s.reason) for s in offer.shed] == [("l1", "displaced")]
    offer = q.offer("l2", "low", 0.0, has_capacity=False)
    assert offer.verdict is Verdict.SHED and offer.shed[0].reason == "queue_full"
    assert offer.shed[0].retry_after_s >= 1


def test_deadlines_expire_queued_requests() -> None:
    q = queue()
    q.offer("late", "normal", 0.0, has_capacity=False, deadline=1.0)
    q.offer("fine", "normal", 0.0, has_capacity=False, deadline=10.0)
    item, expired = q.pop_ready(2.0)
    assert item == "fine" and [(s.item, s.reason) for s in expired] == [("late", "deadline")]
    past = q.offer("past", "normal", 5.0, has_capacity=False, deadline=4.0)
    assert past.verdict is Verdict.SHED and past.shed[0].reason == "deadline"


def test_expire_withdraws_every_overdue_entry_without_dispatching() -> None:
    q = queue()
    q.offer("h-late", "high", 0.0, has_capacity=False, deadline=1.0)
    q.offer("n-ok", "normal", 0.0, has_capacity=False, deadline=9.0)
    q.offer("l-late", "low", 0.0, has_capacity=False, deadline=2.0)
    assert [s.item for s in q.expire(3.0)] == ["h-late", "l-late"]
    assert len(q) == 1 and q.pop_ready(3.0) == ("n-ok", [])


def test_retry_after_follows_the_drain_rate() -> None:
    q = queue(max_queue=100)
    for i in range(50):
        q.offer(i, "normal", 0.0, has_capacity=False)
    for step in range(30):  # drains 2 per second
        q.pop_ready(step * 0.5)
    # 20 waiting + 1 at ~2/s: about 11 s.
    assert 8 <= q.retry_after() <= 14


def test_withdrawn_requests_are_skipped() -> None:
    q = queue()
    q.offer("a", "normal", 0.0, has_capacity=False)
    q.offer("b", "normal", 0.0, has_capacity=False)
    assert q.remove("a") and not q.remove("a")
    assert len(q) == 1 and q.pop_ready(0.0)[0] == "b"


def test_unknown_priority_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown priority 'urgent'; known: high, normal, low"):
        queue().offer("x", "urgent", 0.0, has_capacity=True)


ops = st.lists(
    st.tuples(
        st.sampled_from(["offer", "pop", "remove"]),
        st.integers(0, 30),  # item
        st.sampled_from(["high", "normal", "low"]),
        st.booleans(),  # has_capacity
    ),
    max_size=120,
)


@given(ops)
def test_queue_matches_a_model(seq) -> None:
    q = queue(max_queue=8)
    rank = {"high": 0, "normal": 1, "low": 2}
    waiting: dict[str, int] = {}  # item -> rank
    for op, n, priority, room in seq:
        item = f"r{n}"
        if op == "offer":
            if item in waiting:
                continue
            offer = q.offer(item, priority, 0.0, has_capacity=room)
            blocked = any(r <= rank[priority] for r in waiting.values())
            assert (offer.verdict is Verdict.ADMIT) == (room and not blocked)
            for shed in offer.shed:
                waiting.pop(shed.item, None)
            if offer.verdict is Verdict.QUEUED:
                waiting[item] = rank[priority]
        elif op == "pop":
            got, expired = q.pop_ready(0.0)
            assert not expired
            if waiting:
                best = min(waiting.values())
                assert waiting.pop(got) == best  # highest priority first
            else:
                assert got is None
        else:
            assert q.remove(item) == (waiting.pop(item, None) is not None)
        assert len(q) == len(waiting) <= 8


def test_tenants_in_one_class_are_served_fairly() -> None:
    q = AdmissionQueue()
    for i in range(6):
        q.offer(f"a{i}", "normal", 0.0, has_capacity=False, tenant="burst")
    q.offer("b0", "normal", 0.0, has_capacity=False, tenant="quiet")
    q.offer("b1", "normal", 0.0, has_capacity=False, tenant="quiet")
    order = [q.pop_ready(1.0)[0] for _ in range(8)]
    assert order == ["a0", "b0", "a1", "b1", "a2", "a3", "a4", "a5"]


def test_a_late_quiet_tenant_jumps_the_bursts_tail_but_not_its_head() -> None:
    q = AdmissionQueue()
    for i in range(10):
        q.offer(f"a{i}", "normal", 0.0, has_capacity=False, tenant="burst")
    assert [q.pop_ready(1.0)[0] for _ in range(3)] == ["a0", "a1", "a2"]
    q.offer("b0", "normal", 2.0, has_capacity=False, tenant="quiet")
    order = [q.pop_ready(3.0)[0] for _ in range(8)]
    assert order == ["a3", "b0", "a4", "a5", "a6", "a7", "a8", "a9"]


def test_priority_still_beats_fairness() -> None:
    q = AdmissionQueue()
    q.offer("low", "low", 0.0, has_capacity=False, tenant="t1")
    q.offer("high", "high", 0.0, has_capacity=False, tenant="t2")
    assert q.pop_ready(1.0)[0] == "high"


def test_pop_ready_can_be_limited_to_the_top_classes() -> None:
    q = AdmissionQueue()
    q.offer("n1", "normal", 0.0, has_capacity=False)
    assert q.pop_ready(1.0, max_rank=0) == (None, [])
    q.offer("h1", "high", 0.0, has_capacity=False)
    assert q.pop_ready(1.0, max_rank=0)[0] == "h1"
    assert q.pop_ready(1.0)[0] == "n1"


def test_items_leaving_out_of_turn_do_not_grow_the_queue_without_bound() -> None:
    """SLO-aware admission takes held requests out of turn and clients withdraw theirs; the
    entries they leave behind are dropped once they are most of the heap."""
    q = AdmissionQueue(AdmissionSettings(max_queue=10_000))
    for i in range(5_000):
        q.offer(i, "normal", 0.0, has_capacity=False)
        if i >= 10:
            assert q.take(i - 10, 0.0) if i % 2 else q.remove(i - 10)
    assert len(q) == 10 and q.peek() == list(range(4_990, 5_000))
    assert len(q._heap) <= 2 * 64 + 10  # the leak this guards against


def test_total_slots_follow_backend_states_and_discovered_limits() -> None:
    """The core keeps its slot count between changes (asked twice a request): a backend that
    goes down, a discovered one's limit, and one that leaves must each show at once."""
    a, b = Backend("a", "H100", ["m"]), Backend("b", "L4", ["m"])
    pool = BackendSet([a, b])
    core = Admission(AdmissionSettings(), pool, {"a": 10, "b": 4})
    assert core.total_slots() == 14
    pool.set_state(b, BackendState.EJECTED, 1.0, "breaker open")
    assert core.total_slots() == 10
    pool.add(Backend("c", "T4", ["m"]))
    core.set_limit("c", 3)
    assert core.total_slots() == 13
    core.set_limit("a", 20)
    assert core.total_slots() == 23
    pool.remove("c")
    core.set_limit("c", None)
    assert core.total_slots() == 20 and core.has_room("a")


# -- the core's Admission: slots, the reserved share, standby, the queue (sans-IO) ------------
def life(rid: int, priority: str = "normal", model: str = "m") -> RequestLifetime:
    return RequestLifetime(RequestInfo(rid, model, 1, priority=priority))


def one_backend(slots: int, reserved: float = 0.0, timeout_s: float = 30.0) -> Admission:
    pool = BackendSet([Backend("b", "H100", ["m"])])
    settings = AdmissionSettings(default_timeout_s=timeout_s)
    return Admission(settings, pool, {"b": slots}, reserved_top_fraction=reserved)


def test_the_gate_parks_a_waiter_wakes_it_on_pump_and_withdraws_one_whose_client_left() -> None:
    """What the async shell (router/front/admission.py) adds to the core, whose rules (the
    reserved share, standby, the queue's order) the core tests here check: a request with
    no room parks on a future in its shell, a finished request's `pump` wakes the first
    waiter admitted, and a waiter cancelled (its client left) is withdrawn from the core's
    queue. The gate hands its config's reserved share and its standby rotation to the core."""

    def parked_life(rid: int) -> RequestLifetime[RequestState]:
        parked: RequestLifetime[RequestState] = life(rid)
        parked.shell = RequestState()  # where the gate parks it (the router's: its Exchange)
        return parked

    async def scenario() -> None:
        pool = BackendSet([Backend("b", "H100", ["m"])])
        rotation = StandbyRotation(pool)
        gate = AdmissionGate(AdmissionConfig(), pool, {"b": 1}, RouterMetrics(), lambda: 0.0,
                             rotation)  # fmt: skip
        reserving = AdmissionGate(AdmissionConfig(reserved_top_fraction=0.2), pool, {"b": 1},
                                  RouterMetrics(), lambda: 0.0)  # fmt: skip
        assert gate.core.standby is rotation and reserving.core.slots.reserved_top_fraction == 0.2
        first, second, third = (parked_life(i) for i in range(3))
        await asyncio.wait_for(gate.admit(first, None), 1.0)  # room: at once
        assert first.admitted and first.shell.queued is None
        waiting = [asyncio.create_task(gate.admit(x, None)) for x in (second, third)]
        await asyncio.sleep(0)  # let them park
        assert not any(task.done() for task in waiting) and len(gate.queue) == 2
        assert second.shell.queued is not None and third.shell.queued is not None
        waiting[1].cancel()  # third's client left
        with pytest.raises(asyncio.CancelledError):
            await waiting[1]
        assert len(gate.queue) == 1 and third.shell.queued is None and not third.admitted
        assert not waiting[0].done()  # no slot freed yet
        gate.pump()  # first finished: its slot goes to second
        await asyncio.wait_for(waiting[0], 1.0)
        assert second.admitted and second.shell.queued is None and len(gate.queue) == 0
        assert gate.slots.admitted == 1

    asyncio.run(scenario())


def test_the_reserved_share_is_left_to_the_most_important_class_exactly() -> None:
    """10 slots, 20 % reserved: 8 of any class, the last 2 only for `high`; a freed slot
    goes to a waiting `high` and stays free for a waiting `normal` while only reserved
    room is left."""
    core = one_backend(10, reserved=0.2)
    verdicts = [core.offer(life(i), 0.0).verdict for i in range(9)]
    assert verdicts == [Verdict.ADMIT] * 8 + [Verdict.QUEUED]
    assert core.slots.admitted == 8 and not core.has_capacity("normal")
    assert core.has_capacity("high") and core.has_capacity()
    top = [life(10, "high"), life(11, "high")]
    assert [core.offer(x, 0.0).verdict for x in top] == [Verdict.ADMIT, Verdict.ADMIT]
    assert core.slots.admitted == 10 and all(x.admitted for x in top)
    waiting_high = life(12, "high")
    assert core.offer(waiting_high, 0.0).verdict is Verdict.QUEUED
    core.release()  # 9 taken: room only in the reserved share
    assert core.dispatch(1.0) == [(waiting_high, None)] and waiting_high.admitted
    for _ in range(2):  # 9 taken, then 8: still no room outside the reserved share
        core.release()
        assert core.dispatch(1.0) == [] and len(core.queue) == 1  # `normal` still waits
    core.release()  # 7 taken: room for any class again
    decided = core.dispatch(1.0)
    assert [(x.request_id, shed) for x, shed in decided] == [(8, None)]
    assert core.slots.admitted == 8 and len(core.queue) == 0


def test_dispatch_returns_the_expired_and_the_admitted_in_the_order_decided() -> None:
    core = one_backend(1, timeout_s=5.0)
    first, late, next_ = life(1), life(2), life(3)
    assert core.offer(first, 0.0).verdict is Verdict.ADMIT
    assert core.offer(late, 0.0, deadline=2.0).verdict is Verdict.QUEUED
    assert core.offer(next_, 1.0).verdict is Verdict.QUEUED
    core.release()
    decided = core.dispatch(3.0)
    assert [(x.request_id, s and s.reason) for x, s in decided] == [(2, "deadline"), (3, None)]
    assert next_.admitted and not late.admitted and core.slots.admitted == 1
    assert core.expire(10.0) == [] and len(core.queue) == 0


def test_full_slots_bring_in_a_standby_backend_of_the_request_s_model_only() -> None:
    on, sb, other = (
        Backend("on", "L4", ["m"]),
        Backend("sb", "L4", ["m"]),
        Backend("x", "L4", ["x"]),
    )
    pool = BackendSet([on, sb, other])
    for standby in (sb, other):
        pool.set_state(standby, BackendState.STANDBY, 0.0, "consul: standby")
    core = Admission(AdmissionSettings(), pool, {"on": 1, "sb": 1, "x": 1},
                     standby=StandbyRotation(pool))  # fmt: skip
    assert core.offer(life(1), 1.0).verdict is Verdict.ADMIT
    assert sb.state is BackendState.STANDBY  # there was room: nothing came in
    assert core.offer(life(2, model="y"), 1.0).verdict is Verdict.QUEUED  # none serves y
    assert other.state is BackendState.STANDBY
    assert core.offer(life(3, "high"), 2.0).verdict is Verdict.ADMIT  # sb came in for m
    assert (sb.state, sb.reason, core.total_slots()) == (BackendState.READY, PROMOTED, 2)
    assert core.offer(life(4, "high"), 2.0).verdict is Verdict.QUEUED  # nothing left for m


def test_without_limits_every_request_is_admitted_at_once_and_no_standby_comes_in() -> None:
    """The simulator's default (no `router.max_inflight`): as it ran before admission was
    shared, and what keeps its results unchanged."""
    sb = Backend("sb", "L4", ["m"])
    pool = BackendSet([Backend("on", "L4", ["m"]), sb])
    pool.set_state(sb, BackendState.STANDBY, 0.0, "consul: standby")
    core = Admission(AdmissionSettings(), pool, None, reserved_top_fraction=0.5,
                     standby=StandbyRotation(pool))  # fmt: skip
    lives = [life(i, "low") for i in range(1000)]
    assert {core.offer(x, 0.0).verdict for x in lives} == {Verdict.ADMIT}
    assert core.has_room("on") and sb.state is BackendState.STANDBY
    assert core.slots.admitted == 1000 and core.dispatch(0.0) == []


def test_the_simulator_admits_through_the_same_core() -> None:
    """sim/admission.py: one slot; the second request waits, goes when the first's slot is
    released (at `let_in`, once the event at hand is handled), and a third waits past its
    deadline and is refused on the tick. Without a limit everything goes at once."""
    from gpuroute.router.core.lifetime import Event, Lifetimes, Phase
    from gpuroute.sim.admission import SimAdmission

    went: list[tuple[int | str, float]] = []
    refused: list[int | str] = []
    pool = BackendSet([Backend("b", "H100", ["m"])])
    sim = SimAdmission(1, pool, None, go=lambda life, now: went.append((life.request_id, now)),
                       refuse=lambda life: refused.append(life.request_id))  # fmt: skip
    lifetimes = Lifetimes()
    first, second, third = (lifetimes.open(RequestInfo(i, "m", 1)) for i in range(3))
    sim.arrive(first, 0.0)
    sim.arrive(second, 0.5)
    assert went == [(0, 0.0)] and second.phase is Phase.QUEUED and not sim.due
    assert lifetimes.close(first, Event.FINISH).admitted
    sim.released()
    assert sim.due and went == [(0, 0.0)]  # not before the event at hand is handled
    sim.let_in(1.0)
    assert went == [(0, 0.0), (1, 1.0)] and second.phase is Phase.ROUTING and not sim.due
    sim.arrive(third, 1.0)
    sim.tick(31.5)  # the default 30 s queueing deadline passed
    assert refused == [2] and len(sim.core.queue) == 0
    free = SimAdmission(None, pool, None, go=lambda life, now: went.append((life.request_id, now)),
                        refuse=refused.append)  # fmt: skip
    for i in range(3, 300):
        free.arrive(lifetimes.open(RequestInfo(i, "m", 1)), 2.0)
    assert len(went) == 2 + 297 and refused == [2]
