"""Single use of residency decisions (router/core/replay.py): exact cases and a model check."""

from __future__ import annotations

from gpuroute.router.core.replay import ReplayGuard
from hypothesis import given, settings
from hypothesis import strategies as st


def test_a_nonce_is_good_once_until_its_decision_expires() -> None:
    guard = ReplayGuard()
    assert guard.first_use("a", expires=110.0, now=100.0)
    assert not guard.first_use("a", expires=110.0, now=105.0)
    assert guard.first_use("b", expires=111.0, now=105.0)
    assert not guard.first_use("a", expires=110.0, now=110.0)  # still valid at its expiry
    assert guard.first_use("c", expires=121.0, now=111.5)  # a and b expired: forgotten
    assert len(guard) == 1


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcdef"), st.floats(0, 5), st.floats(0, 20)),
        max_size=60,
    )
)
def test_no_replay_within_validity_and_memory_only_for_valid_decisions(events) -> None:
    """Against a model that remembers everything: a nonce seen and still valid is refused,
    any other accepted; once every decision has expired, the guard holds nothing else."""
    guard, seen, now = ReplayGuard(), {}, 0.0
    for nonce, step, ttl in events:
        now += step
        expires = now + ttl
        replay = nonce in seen and seen[nonce] >= now
        assert guard.first_use(nonce, expires, now) is not replay
        if not replay:
            seen[nonce] = expires
    assert guard.first_use("fresh", now + 100.0, now + 30.0)
    assert len(guard) == 1
