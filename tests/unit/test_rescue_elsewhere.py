"""A waiting attempt moves off a slow backend only when another backend could take it,
in both worlds (the rule is the core Watcher's): the only engine of its model, or a
canary's only version, keeps it; a lost host gives it up whatever."""

from __future__ import annotations

from gpuroute.router.core import Backend, BackendSet, RequestInfo, Scheduler
from gpuroute.router.core.backend import BackendState
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.policies import build_policy
from gpuroute.router.core.slowness import should_rescue
from gpuroute.router.core.watching import Watcher


def watcher(*backends: Backend) -> Watcher:
    scheduler = Scheduler(BackendSet(backends), build_policy("least_outstanding_work"))
    return Watcher(scheduler, {}, rescue_slowness=10.0)


def slow(backend_id: str, models: tuple[str, ...]) -> Backend:
    backend = Backend(backend_id, "H100", models)
    backend.slowness = 50.0  # past rescue_slowness
    return backend


def test_a_slow_backend_keeps_an_attempt_that_has_nowhere_else_to_go() -> None:
    stuck = slow("b1", ("m@v2",))
    w = watcher(stuck, Backend("b2", "H100", ("m@v1",)))
    canary = RequestLifetime(RequestInfo("r1", "m@v2", 10))
    canary.tried.add("b1")
    # waited 100 s for an expected 1 s, on a backend 50x slow: moved if it could be
    assert not w.should_move(canary, stuck, 100.0, 1.0, lost=False)
    assert w.should_move(canary, stuck, 100.0, 1.0, lost=True)  # its host is gone
    # a fallback that b2 serves is somewhere else to go
    with_fallback = RequestLifetime(RequestInfo("r2", "m@v2", 10, fallbacks=("m@v1",)))
    with_fallback.tried.add("b1")
    assert w.should_move(with_fallback, stuck, 100.0, 1.0, lost=False)


def test_a_second_engine_of_the_model_is_somewhere_else_unless_tried() -> None:
    stuck, other = slow("b1", ("m",)), Backend("b2", "H100", ("m",))
    w = watcher(stuck, other)
    life = RequestLifetime(RequestInfo("r", "m", 10))
    life.tried.add("b1")
    assert w.should_move(life, stuck, 100.0, 1.0, lost=False)
    life.tried.add("b2")
    assert not w.should_move(life, stuck, 100.0, 1.0, lost=False)
    assert not w.should_move(RequestLifetime(RequestInfo("q", "m", 10)), stuck, 0.5, 1.0,
                             lost=False)  # fmt: skip  # not yet waited past its expectation


def test_suspects_are_the_backends_the_rescue_rule_can_move_attempts_off() -> None:
    """`Watcher.suspect` is the rescue rule short of a lost host: whatever the wait, an
    attempt on a backend that is no suspect stays (the simulator scans only suspects')."""
    w = watcher(Backend("b0", "H100", ("m",)))
    for ejected in (False, True):
        for slowness in (1.0, 9.9, 10.0, 50.0):
            for rescue_slowness in (0.0, 10.0):
                backend = Backend("b1", "H100", ("m",))
                backend.slowness = slowness
                if ejected:
                    backend.state = BackendState.EJECTED
                w.rescue_slowness = rescue_slowness
                suspect = w.suspect(backend)
                assert suspect == (bool(rescue_slowness) and (ejected or slowness >= 10.0))
                moved = should_rescue(
                    lost=False,
                    ejected=ejected,
                    slowness=slowness,
                    rescue_slowness=rescue_slowness,
                    waited_s=100.0,
                    expected_s=1.0,
                )
                assert moved == suspect  # a long wait: moved exactly off the suspects
