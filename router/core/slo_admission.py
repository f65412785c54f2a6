"""SLO-aware admission (sans-IO): requests that no backend is predicted to serve within
their SLO wait here, by class, while their TTFT budget lasts; then they are refused.

Sending a request that is predicted to miss helps nobody: it misses, and its prefill
lengthens every stream already running there. Holding it a little costs only its own
budget: when a finishing stream frees room, the most important class goes first (then
first come, first served), so batch work never takes room an interactive request is waiting
for. A request whose TTFT budget is gone is refused (429 with Retry-After naming its class)
instead of being sent to miss; one that cannot even be held (the queue is at its limit with
nothing less important to displace) is refused at once, in microseconds rather than after a
minute in an engine's queue."""

from __future__ import annotations

import math
from collections.abc import Hashable

from gpuroute.router.core.admission import AdmissionQueue, AdmissionSettings, Shed
from gpuroute.router.core.slo import SloClass, SloClasses

# Held requests offered room each time some may have freed (a stream ended, a first token
# came): a bounded number, most important first, so one event costs a few routing decisions
# however long the queue (the live router and the simulator use the same bound).
OFFERS_PER_EVENT = 8


class HoldQueue(AdmissionQueue):
    """The admission queue with the SLO classes as its priorities and each request's TTFT
    budget as its deadline. Room is offered to the first few (`peek`); the one that fits
    leaves out of turn (`take`); sheds name the class (`Shed.priority`)."""

    def __init__(self, classes: SloClasses, max_held: int = 1024) -> None:
        super().__init__(AdmissionSettings(priorities=tuple(classes.names()), max_queue=max_held))

    def waiting_before(self, slo: SloClass) -> bool:
        """Whether requests of a more important class than `slo` are held: room that frees
        is theirs first, so one of `slo` arriving now waits its turn too."""
        return any(self._waiting[: self.rank(slo.name)])

    def hold(self, item: Hashable, slo: SloClass, arrived_at: float, now: float) -> list[Shed]:
        """Hold `item` (of class `slo`, its TTFT clock started at `arrived_at`) while its
        TTFT budget lasts; returns who is refused for it: the newcomer itself (budget gone,
        or the queue full of equal or more important work) or the newest held request of
        the least important class below it."""
        deadline = arrived_at + slo.ttft_s
        return list(self.offer(item, slo.name, now, has_capacity=False, deadline=deadline).shed)


class MarginController:
    """Keeps the requests it admits meeting their SLO by adjusting the prediction margin.

    Predictions err, and at overload they err towards optimism (what is admitted after a
    request adds prefill interference to it). Each finished request's verdict nudges the
    margin (a stochastic approximation to a met-rate of `target`): a miss tightens it by
    `step` x target, a hit loosens it by `step` x (1 - target). At equilibrium `target` of
    admitted requests meet their SLO, whatever the fleet, trace or predictor's bias."""

    __slots__ = ("high", "low", "margin", "step", "target")

    def __init__(
        self,
        margin: float = 0.9,
        *,
        target: float = 0.95,
        step: float = 0.01,
        low: float = 0.3,
        high: float = 1.0,
    ) -> None:
        if not 0 < low <= margin <= high or not 0 < target < 1 or step <= 0:
            raise ValueError("need 0 < low <= margin <= high, target in (0, 1), step > 0")
        self.margin, self.target, self.step = margin, target, step
        self.low, self.high = low, high

    def observe(self, met: bool) -> float:
        self.margin += self.step * ((1.0 if met else 0.0) - self.target)
        self.margin = min(max(self.margin, self.low), self.high)
        return self.margin


class TypeMargins:
    """A margin per GPU type, corrected only by the verdicts of requests served on that
    type. One margin for the whole fleet let the misses of one kind of GPU (slow L4s and
    T4s stalling their streams) close every other kind: requests were refused while faster
    GPUs were predicted to serve them in time. A type's evidence ages (`memory_s`):
    without verdicts its margin returns towards the start, so a type closed by a bad spell
    is tried again rather than shut for good."""

    __slots__ = ("_by_type", "high", "margin", "memory_s", "target")

    def __init__(
        self,
        margin: float = 0.9,
        *,
        target: float = 0.95,
        high: float = 1.0,
        memory_s: float = 300.0,
    ) -> None:
        MarginController(margin, target=target, high=high)  # the same checks, made now
        if memory_s <= 0:
            raise ValueError("memory_s must be > 0")
        self.margin, self.target, self.high, self.memory_s = margin, target, high, memory_s
        self._by_type: dict[str, tuple[MarginController, list[float]]] = {}

    def of(self, gpu_type: str, now: float) -> float:
        """The margin of a GPU type at `now` (a type first seen starts at `margin`)."""
        return self._aged(gpu_type, now).margin

    def observe(self, gpu_type: str, met: bool, now: float) -> float:
        """A request served on `gpu_type` met its SLO or not; returns its new margin."""
        return self._aged(gpu_type, now).observe(met)

    def _aged(self, gpu_type: str, now: float) -> MarginController:
        entry = self._by_type.get(gpu_type)
        if entry is None:
            control = MarginController(self.margin, target=self.target, high=self.high)
            self._by_type[gpu_type] = (control, [now])
            return control
        control, seen = entry
        elapsed = now - seen[0]
        if elapsed > 0:
            kept = math.exp(-elapsed / self.memory_s)
            control.margin = self.margin + (control.margin - self.margin) * kept
            seen[0] = now
        return control
