"""The I/O side of SLO-aware admission: a request's class, and holding the requests that no
backend is predicted to serve within it (core/slo_admission.py decides; this parks them).

A held request waits while its TTFT budget lasts; whenever a stream finishes or a first
token arrives the attempts loop (core/placement.py) offers the room to the held requests and
wakes those it booked; past its budget it is refused with 429, a
Retry-After hint and its class named, in milliseconds rather than after a minute in an
engine's queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from gpuroute.router.attempts.exchange import Exchange, Held, RequestState
from gpuroute.router.config.router import SloConfig
from gpuroute.router.core.admission import Shed
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.scheduler import Decision
from gpuroute.router.core.slo import SloClass, SloClasses, time_per_output_token
from gpuroute.router.core.slo_admission import HoldQueue
from gpuroute.router.observe.metrics import RouterMetrics
from gpuroute.router.shared.quotas import KeyPolicy

from gpuroute.openai_api import Rejection, clip

SLO_HEADER = "x-gpuroute-slo"


def slo_classes(config: SloConfig) -> SloClasses:
    return SloClasses((c.slo_class() for c in config.classes), config.default_class)


def refusal(refused: Shed) -> Rejection:
    return Rejection(
        429,
        f"no backend can serve SLO class {refused.priority!r} within its objective now "
        f"({refused.reason}); retry after the hinted delay",
        code="slo_unattainable",
        headers={"Retry-After": str(refused.retry_after_s)},
    )


class SloGate:
    def __init__(
        self,
        config: SloConfig,
        metrics: RouterMetrics,
        clock: Callable[[], float],
        *,
        on_hold: Callable[[str], None] = lambda model: None,
    ) -> None:
        self.on_hold = on_hold  # a hold proves its pool short (router/scaling/autoscaler.py)
        self.classes = slo_classes(config)
        self.queue = HoldQueue(self.classes, config.max_held)
        self.metrics, self.clock = metrics, clock

    def resolve(
        self, key: KeyPolicy, headers: Mapping[str, str], model_class: str | None = None
    ) -> SloClass:
        """The request's class: the header's if it is not more demanding than the key's
        (else its model's, else the default), else that one; Rejection 400 for a class
        nobody configured."""
        base = self.classes.get(key.slo_class or model_class)
        asked = headers.get(SLO_HEADER)
        if asked is None:
            return base
        try:
            wanted = self.classes.get(asked.strip().lower())
        except ValueError:
            raise Rejection(
                400,
                f"unknown SLO class {clip(asked)!r}; known: {', '.join(self.classes.names())}",
                param=SLO_HEADER,
                code="invalid_slo_class",
            ) from None
        rank = self.classes.rank
        return wanted if rank[wanted.name] >= rank[base.name] else base

    async def hold(
        self,
        life: RequestLifetime[RequestState],
        refused: Iterable[Shed] = (),
        *,
        short: bool = True,
    ) -> Decision:
        """Wait, in the hold queue the attempts loop put it in, for room (`wake` brings its
        booked decision); Rejection (429) when its TTFT budget runs out first or a more
        important request displaces it (`refused`: those the queue refused as it took this
        one, which may be this one). It is parked on its shell (`Exchange.held`)."""
        info = life.info
        assert info.slo is not None
        assert life.shell is not None
        held = life.shell.held = Held(asyncio.Event())
        if short:  # held because its pool is short, not for a more important class
            self.on_hold(info.model)
        self.refuse_all(refused)
        if held.refused is None:  # not refused as the queue took it
            self.metrics.slo_held.labels(info.slo.name).inc()
        deadline = self.queue.deadline(life)
        try:
            while deadline is not None and held.refused is None and held.decision is None:
                try:
                    await asyncio.wait_for(held.event.wait(), max(deadline - self.clock(), 0.0))
                except TimeoutError:
                    if held.decision is not None:  # booked as its budget ran out
                        break
                    self.queue.remove(life)
                    self._refuse(Shed(life, "deadline", self.queue.retry_after(), info.slo.name))
                    break
                held.event.clear()
            if held.decision is not None:
                return held.decision
            assert held.refused is not None
            raise refusal(held.refused)
        finally:
            if life.shell is not None:
                life.shell.held = None
            self.queue.remove(life)

    def judge(
        self, exchange: Exchange, now: float, tokens: int
    ) -> tuple[float | None, bool] | None:
        """A served request's TPOT and whether it met its class (counted per class), timed
        from its first token (a stream's first text, not the role chunk before it)."""
        slo, arrival = exchange.info.slo, exchange.arrival
        first_at = exchange.first_token_at or exchange.first_at
        if slo is None or first_at is None:
            return None
        tpot = time_per_output_token(first_at, now, tokens)
        met = slo.met(first_at - arrival, tpot, now - arrival)
        outcome = "met" if met else "missed"
        model = self.metrics.model_label(exchange.life.model)
        self.metrics.slo_requests_by(slo.name, model, outcome).inc()
        return tpot, met

    def wake(self, placed: Iterable[tuple[RequestLifetime[RequestState], Decision]]) -> None:
        """Held requests the attempts loop has just booked: each gets its decision."""
        for life, decision in placed:
            held = None if life.shell is None else life.shell.held
            if held is not None:
                held.decision = decision
                held.event.set()

    def refuse_all(self, refused: Iterable[Shed]) -> None:
        for shed in refused:
            self._refuse(shed)

    def _refuse(self, refused: Shed) -> None:
        model = self.metrics.model_label(refused.item.model)
        self.metrics.slo_requests_by(refused.priority, model, "refused").inc()
        shell = refused.item.shell
        held = None if shell is None else shell.held
        if held is not None:
            held.refused = refused
            held.event.set()
