"""`gpuroute scale`'s core: routers' answers read and merged (the most any asks), the
executor called at the first answer, on a change and after a failure, and how an
autoscaling group follows one pool's target (router/core/scale_targets.py)."""

from __future__ import annotations

import pytest
from gpuroute.router.core.scale_targets import (
    FollowPlan,
    PoolTarget,
    RouterAnswers,
    document,
    follow_plan,
    highest,
    read_answer,
)
from hypothesis import given
from hypothesis import strategies as st


def answer(interval: float = 15.0, **pools: tuple[int, int]) -> dict:
    sizes = {
        p: {"desired_backends": a, "desired_standby_backends": s, "in_rotation": a, "standby": s,
            "rate_rps": 1.0, "forecast_rps": 1.0, "utilisation": 0.5, "capacity_rps": 2.0,
            "reason": "steady"}
        for p, (a, s) in pools.items()
    }  # fmt: skip
    return {"interval_s": interval, "pools": sizes}


def test_an_answer_reads_as_each_pools_target() -> None:
    interval, pools = read_answer(answer(5, m=(3, 1), n=(1, 0)))
    assert interval == 5.0
    assert pools == {"m": PoolTarget(3, 1), "n": PoolTarget(1, 0)}
    assert document(pools) == {
        "pools": {
            "m": {"desired_backends": 3, "desired_standby_backends": 1},
            "n": {"desired_backends": 1, "desired_standby_backends": 0},
        }
    }


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "not a JSON object"),
        ({"pools": {}}, "interval_s: expected a number > 0, got None"),
        ({"interval_s": 0, "pools": {}}, "interval_s"),
        ({"interval_s": True, "pools": {}}, "interval_s"),
        ({"interval_s": 5}, "pools: expected an object, got NoneType"),
        ({"interval_s": 5, "pools": {"m": 3}}, "pools.m: expected an object"),
        ({"interval_s": 5, "pools": {"m": {"desired_backends": 1}}},
         "pools.m.desired_standby_backends: expected an integer >= 0, got None"),
        ({"interval_s": 5, "pools": {"m": {"desired_backends": -1,
                                            "desired_standby_backends": 0}}},
         "pools.m.desired_backends"),
        ({"interval_s": 5, "pools": {"m": {"desired_backends": 1.5,
                                            "desired_standby_backends": 0}}},
         "pools.m.desired_backends"),
    ],
)  # fmt: skip
def test_a_wrong_answer_names_its_field(body: object, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        read_answer(body)


def test_each_pool_takes_the_most_any_router_asks() -> None:
    merged = highest([{"m": PoolTarget(3, 0), "n": PoolTarget(1, 1)}, {"m": PoolTarget(2, 2)}, {}])
    assert merged == {"m": PoolTarget(3, 2), "n": PoolTarget(1, 1)}


def test_the_executor_is_called_at_the_first_answer_on_a_change_and_after_a_failure() -> None:
    answers = RouterAnswers(["a", "b"], stale_after_s=60)
    assert answers.due(0) is None  # nobody answered yet
    answers.answered("a", 0, 15, {"m": PoolTarget(1, 1)})
    first = answers.due(0)
    assert first == {"m": PoolTarget(1, 1)}
    answers.applied(first)
    assert answers.due(1) is None  # unchanged
    answers.answered("b", 1, 10, {"m": PoolTarget(2, 1)})
    assert answers.due(1) == {"m": PoolTarget(2, 1)}
    assert answers.interval_s() == 10
    answers.failed()  # the executor did not take it
    assert answers.due(2) == {"m": PoolTarget(2, 1)}
    answers.applied({"m": PoolTarget(2, 1)})
    assert answers.due(2) is None


def test_a_silent_router_cannot_shrink_a_pool_until_its_answer_is_stale() -> None:
    answers = RouterAnswers(["a", "b"], stale_after_s=60)
    answers.answered("a", 0, 15, {"m": PoolTarget(4, 1)})
    answers.answered("b", 0, 15, {"m": PoolTarget(2, 1)})
    answers.applied(answers.due(0))
    answers.answered("b", 30, 15, {"m": PoolTarget(1, 1)})  # a is silent since 0
    assert answers.targets(30) == {"m": PoolTarget(4, 1)}
    assert answers.current(61) == ["b"]
    assert answers.due(61) == {"m": PoolTarget(1, 1)}
    assert RouterAnswers(["a"], 60).targets(0) is None


def test_a_scaler_needs_a_router_and_a_stale_bound() -> None:
    with pytest.raises(ValueError):
        RouterAnswers([], 60)
    with pytest.raises(ValueError):
        RouterAnswers(["a"], -1)


@pytest.mark.parametrize(
    ("hosts", "target", "plan"),
    [
        ((1, 1, 0), (1, 1), FollowPlan()),
        ((1, 1, 0), (3, 1), FollowPlan(activate=1, boot=2)),  # standby in first, then boot
        ((1, 0, 2), (3, 1), FollowPlan(boot=1)),  # booting ones count
        ((3, 1, 2), (2, 1), FollowPlan(cancel=2, drain=1)),  # boots go first
        ((3, 2, 0), (3, 1), FollowPlan(stop_standby=1)),
        ((4, 2, 0), (1, 1), FollowPlan(stop_standby=1, drain=3)),
        ((3, 0, 0), (2, 1), FollowPlan(to_standby=1)),  # an active host refills standby
        ((4, 0, 0), (1, 1), FollowPlan(to_standby=1, drain=2)),
        ((0, 3, 0), (1, 0), FollowPlan(activate=1, stop_standby=2)),
    ],
)
def test_a_pool_follows_its_target_in_one_step(
    hosts: tuple[int, int, int], target: tuple[int, int], plan: FollowPlan
) -> None:
    assert follow_plan(*hosts, PoolTarget(*target)) == plan


counts = st.integers(0, 12)


@given(counts, counts, counts, counts, counts)
def test_one_step_reaches_the_target_and_never_both_grows_and_shrinks(
    active: int, standby: int, booting: int, want_active: int, want_standby: int
) -> None:
    target = PoolTarget(want_active, want_standby)
    plan = follow_plan(active, standby, booting, target)
    after_active = active + plan.activate - plan.to_standby - plan.drain
    after_standby = standby - plan.activate + plan.to_standby - plan.stop_standby
    after_booting = booting - plan.cancel + plan.boot
    assert min(after_active, after_standby, after_booting) >= 0
    assert after_active + after_standby + after_booting == target.desired
    assert after_active <= want_active or after_standby == want_standby
    assert not (plan.boot and (plan.cancel or plan.stop_standby or plan.drain))
    assert not (plan.activate and plan.to_standby)
    if plan.boot:  # never boot while a standby host could go in
        assert after_standby == 0 or active + plan.activate >= want_active
