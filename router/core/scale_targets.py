"""What `gpuroute scale` hands an executor, and how an executor follows it (sans-IO).

Each router answers `GET /admin/autoscale` with its pools' desired sizes; the fleet wants,
per pool, the highest any router asks (as the Terraform policy takes the Maximum: a router
that lags never shrinks the pool). A router that stops answering keeps its last answer for
`stale_after_s`, so an unreachable router cannot shrink a pool either. The executor is
called at the first answer and then only when a size changes, and again after it failed.

`follow_plan` is how an executor follows one pool's target: its warm standby goes into
service first, then new hosts boot; scale-in stops booting hosts first, then surplus
standby, then drains active ones; an active host beyond the target goes back to standby
while standby is short (the simulator's pools, sim/scaling.py, and the local executor,
testbed/local_scaler.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """One pool's desired size: backends in rotation, and warm standby on top."""

    active: int
    standby: int

    @property
    def desired(self) -> int:
        return self.active + self.standby

    def to_json(self) -> dict[str, int]:
        return {"desired_backends": self.active, "desired_standby_backends": self.standby}


def document(targets: Mapping[str, PoolTarget]) -> dict:
    """The JSON an executor gets (stdin of --command, body of --webhook)."""
    return {"pools": {pool: targets[pool].to_json() for pool in sorted(targets)}}


def read_answer(answer: object) -> tuple[float, dict[str, PoolTarget]]:
    """(interval_s, pools) from a router's `/admin/autoscale`; ValueError naming the field
    that is missing or wrong."""
    if not isinstance(answer, dict):
        raise ValueError("the answer is not a JSON object")
    interval = answer.get("interval_s")
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise ValueError(f"interval_s: expected a number > 0, got {interval!r}")
    pools = answer.get("pools")
    if not isinstance(pools, dict):
        raise ValueError(f"pools: expected an object, got {type(pools).__name__}")
    targets = {}
    for pool, size in pools.items():
        if not isinstance(size, dict):
            raise ValueError(f"pools.{pool}: expected an object")
        targets[pool] = PoolTarget(
            _count(size, pool, "desired_backends"), _count(size, pool, "desired_standby_backends")
        )
    return float(interval), targets


def _count(size: dict, pool: str, key: str) -> int:
    value = size.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"pools.{pool}.{key}: expected an integer >= 0, got {value!r}")
    return value


def highest(answers: Iterable[Mapping[str, PoolTarget]]) -> dict[str, PoolTarget]:
    """Per pool, the most any router asks for (active and standby each)."""
    merged: dict[str, PoolTarget] = {}
    for answer in answers:
        for pool, target in answer.items():
            seen = merged.get(pool)
            if seen is not None:
                target = PoolTarget(
                    max(seen.active, target.active), max(seen.standby, target.standby)
                )
            merged[pool] = target
    return merged


@dataclass(slots=True)
class _Answer:
    at: float
    interval_s: float
    pools: dict[str, PoolTarget]


class RouterAnswers:
    """Each router's last answer, what the fleet wants across them, and whether the
    executor must be called with it."""

    def __init__(self, routers: Sequence[str], stale_after_s: float) -> None:
        if not routers:
            raise ValueError("at least one router")
        if stale_after_s < 0:
            raise ValueError("stale_after_s must be >= 0")
        self.routers, self.stale_after_s = list(routers), stale_after_s
        self._answers: dict[str, _Answer] = {}
        self._applied: dict[str, PoolTarget] | None = None  # what the executor last took

    def answered(
        self, router: str, now: float, interval_s: float, pools: dict[str, PoolTarget]
    ) -> None:
        self._answers[router] = _Answer(now, interval_s, pools)

    def current(self, now: float) -> list[str]:
        """The routers whose last answer still counts."""
        return [
            r
            for r in self.routers
            if r in self._answers and now - self._answers[r].at <= self.stale_after_s
        ]

    def interval_s(self) -> float | None:
        """The shortest interval the routers size their pools at (None: none answered)."""
        return min((a.interval_s for a in self._answers.values()), default=None)

    def targets(self, now: float) -> dict[str, PoolTarget] | None:
        """What the fleet wants now; None while no router's answer counts."""
        current = self.current(now)
        if not current:
            return None
        return highest(self._answers[r].pools for r in current)

    def due(self, now: float) -> dict[str, PoolTarget] | None:
        """The targets to hand the executor now: at the first answer, on a change, and
        after a failed call; None when there is nothing to do."""
        targets = self.targets(now)
        if targets is None or targets == self._applied:
            return None
        return targets

    def applied(self, targets: dict[str, PoolTarget]) -> None:
        self._applied = dict(targets)

    def failed(self) -> None:
        """The executor did not take the last targets: hand them over again next time."""
        self._applied = None


@dataclass(frozen=True, slots=True)
class FollowPlan:
    """What one pool's hosts do to meet its target (counts; the caller picks which)."""

    activate: int = 0  # standby hosts into service
    to_standby: int = 0  # active hosts back to standby (they finish what they have)
    boot: int = 0  # new hosts to start
    cancel: int = 0  # booting hosts to stop (the last to be ready first)
    stop_standby: int = 0  # standby hosts to stop at once
    drain: int = 0  # active hosts to drain (least busy first), stopped once empty


def follow_plan(active: int, standby: int, booting: int, target: PoolTarget) -> FollowPlan:
    """One step toward `target` from the pool's hosts in service, in standby and booting:
    standby goes into service first, surplus active hosts refill a short standby, then
    new hosts boot; scale-in cancels boots, then stops surplus standby, then drains active
    hosts. After the step the hosts powered (booting included) are the target's."""
    activate = min(standby, max(target.active - active, 0))
    to_standby = max(min(active - target.active, target.standby - standby), 0)
    active, standby = active + activate - to_standby, standby - activate + to_standby
    powered = active + standby + booting
    if powered <= target.desired:
        return FollowPlan(activate, to_standby, boot=target.desired - powered)
    surplus = powered - target.desired
    cancel = min(booting, surplus)
    surplus -= cancel
    stop_standby = max(min(standby - target.standby, surplus), 0)
    surplus -= stop_standby
    drain = max(min(surplus, active - target.active), 0)
    return FollowPlan(activate, to_standby, 0, cancel, stop_standby, drain)
