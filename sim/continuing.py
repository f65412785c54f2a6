"""Streams that end mid-answer in the simulated router: an engine that crashes under them
(they go on elsewhere as the live router continues them, `AttemptLoop.continued`) and the
streams the rebalancer moves (router/core/rebalance.py), applied through the same
continuation. A mixin of `RegionalRun` (sim/simulator.py), whose state it uses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.rebalance import Move, Rebalancer, RunningStream, expected_left
from gpuroute.router.core.retry import FailureKind
from gpuroute.router.core.scheduler import Outcome, Scheduler
from gpuroute.sim.engine_model import EngineRequest
from gpuroute.sim.report import FAILED
from gpuroute.sim.watch import attempt_of

if TYPE_CHECKING:
    from gpuroute.sim.scenario import Scenario
    from gpuroute.sim.simulator import RegionalRun


def rebalancer_for(scenario: Scenario, scheduler: Scheduler) -> Rebalancer | None:
    """The scenario's [rebalance], on its run's scheduler (None: off)."""
    config = scenario.rebalance
    return Rebalancer(scheduler, config.settings()) if config.enabled else None


class StreamBreaks:
    rebalancer: Rebalancer | None

    def apply_fault(self: RegionalRun, fault, now: float) -> None:
        engine = self.engines[fault.gpu]
        if fault.kind == "slow":
            engine.set_slowdown(fault.factor, now)
        elif fault.kind == "recover":
            engine.set_slowdown(1.0, now)
            engine.recover(now)
        else:
            for req in engine.crash(now):
                self.crashed(req, fault.gpu, now)
            self.offer_room(now)
        self.reschedule(fault.gpu)

    def crashed(self: RegionalRun, req: EngineRequest, e: int, now: float) -> None:
        life = self.lifetimes.get(req.rid)
        if life is None:
            return
        life.attempts.end(self.budget)
        self.watch.ended(life)
        self.scheduler.finish(life, Outcome(False, fatal=True), now)
        if req.first_token_at >= 0:  # the stream broke under its client
            self.go_on(life, self.engines[e].tokens_generated(req, now), req.first_token_at, now)
            return
        # Nothing reached the client (from this attempt): the router retries elsewhere.
        if self.may_retry(life, FailureKind.CONNECTION, now):
            self.dispatch(life, now)

    def go_on(
        self: RegionalRun,
        life: RequestLifetime,
        generated: int,
        first: float,
        now: float,
        prefer: str | None = None,
    ) -> None:
        """A stream whose attempt ended after `generated` tokens goes on elsewhere (the live
        StreamContinuer's way), or ends failed where continuation is off or spent."""
        resumed = life.continued_or_new(first)
        resumed.delivered += generated
        config = self.scenario.continuation
        if not config.enabled or resumed.continuations >= config.max_attempts:
            self.end(life, FAILED)
            return
        resumed.continuations += 1
        self.outcomes.continued += 1
        self.loop.continued(life, generated)
        self.dispatch(life, now, prefer)

    # -- rebalancing -----------------------------------------------------------------------
    def rebalance(self: RegionalRun, now: float) -> None:
        """The router's tick: the streams the rebalancer moves, moved."""
        if self.rebalancer is None:
            return
        moves = self.rebalancer.plan(self.running_streams(now), now)
        for move in moves:
            self.move(move, now)
        if moves:  # (their bookings released: as on every release)
            self.offer_room(now)

    def running_streams(self: RegionalRun, now: float) -> Iterator[RunningStream]:
        """Each stream under way that may still be continued, as the live router would see
        it (the engine model counts the tokens its relay would have)."""
        config = self.scenario.continuation  # (enabled: the scenario refuses moves without)
        for life in list(self.lifetimes):
            attempt = attempt_of(life)
            if attempt is None or attempt.req.first_token_at < 0 or life.latency is None:
                continue
            resumed = life.continued
            if resumed is not None and resumed.continuations >= config.max_attempts:
                continue
            generated = self.engines[attempt.engine].tokens_generated(attempt.req, now)
            expected = life.latency.kv_tokens - life.info.prompt_tokens  # its booking's guess
            first = attempt.req.first_token_at if resumed is None else resumed.first_token_at
            yield RunningStream(
                life,
                self.backends[attempt.engine],
                first,
                generated + (resumed.delivered if resumed else 0),
                expected_left(expected, generated),
                life.info.prompt_tokens + generated,
            )

    def move(self: RegionalRun, move: Move, now: float) -> None:
        """Take the stream off its engine (as a client that left: its KV freed) and
        continue it, preferring the target; its backend gets no verdict."""
        life = move.stream.life
        attempt = attempt_of(life)
        assert attempt is not None
        generated = self.engines[attempt.engine].tokens_generated(attempt.req, now)
        self.engines[attempt.engine].abort(attempt.req, now)
        self.reschedule(attempt.engine)
        self.watch.ended(life)
        self.scheduler.release(life)
        life.attempts.end(self.budget)
        self.outcomes.moved += 1
        self.go_on(life, generated, attempt.req.first_token_at, now, move.to.backend_id)
