"""Moving running streams off a backend where they are predicted to miss their TPOT SLO
(Llumnix's rebalancing, done at the router): sans-IO, time injected.

On the router's tick each running stream is judged on its whole answer: the time it has
decoded so far plus its expected tokens left at the TPOT its backend decodes at now (the
latency model: its batch, prefill interference, its learned ratio, its slowness). Those
predicted to miss their class's TPOT are candidates, the ones with the most output left
first. One moves to the backend (routable for its model, not tried) where it would finish
soonest, and only where the time it saves there is `min_gain` times what the move costs
(its pause: the queue ahead and the prefill, again, of its prompt and the text so far; and
the stall that prefill adds to every stream running there), it is predicted to meet its
TPOT, and that prefill stays within what the protected streams there can take. At most
`max_moves` a tick, one per target (each move changes what the next would see there). The
shell applies a move as a continuation (`AttemptLoop.continued`, then placed preferring
the target)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.latency import LatencyModel
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.core.slo import time_per_output_token


@dataclass(frozen=True, slots=True)
class RunningStream:
    """What the shell knows of a stream under way (its relay counts the tokens)."""

    life: RequestLifetime
    backend: Backend
    first_token_at: float  # its client's first token
    delivered: int  # tokens its client has had, every attempt together
    output_left: float  # tokens still expected (`expected_left`)
    context_tokens: int  # what a move prefills again: its prompt as sent and its text so far


@dataclass(frozen=True, slots=True)
class Move:
    stream: RunningStream
    to: Backend
    saved_s: float  # how much sooner its tokens left come there
    pause_s: float  # what the move costs it: the queue and its prefill there


@dataclass(frozen=True, slots=True)
class RebalanceSettings:
    max_moves: int = 2  # moves per tick at most
    min_gain: float = 4.0  # the time saved over the move's cost a move needs
    min_tokens_left: float = 32.0  # a stream about to end is not worth a prefill


def expected_left(expected_output: float, generated: int) -> float:
    """The tokens a stream is still expected to produce, conservatively: its booking's
    guess less what came, and no more than came so far. The guess, made before any token,
    is a mean: against a stream under way it overestimates the rest, and moves then looked
    more worth their pause than they were (docs/benchmarks.md, "Rebalancing")."""
    return min(max(expected_output - generated, 0.0), float(generated))


def whole_tpot(stream: RunningStream, now: float, pause_s: float, tpot_s: float) -> float:
    """Its whole answer's TPOT (as its SLO counts it) if the rest comes at `tpot_s` after
    `pause_s`."""
    end = now + pause_s + stream.output_left * tpot_s
    tokens = stream.delivered + stream.output_left  # (more than 1: min_tokens_left)
    return time_per_output_token(stream.first_token_at, end, tokens) or 0.0


class Rebalancer:
    def __init__(self, scheduler: Scheduler, settings: RebalanceSettings) -> None:
        self.scheduler, self.settings = scheduler, settings

    def plan(self, streams: Iterable[RunningStream], now: float) -> list[Move]:
        """The streams to move now, and where."""
        latency, settings = self.scheduler.latency, self.settings
        if latency is None:
            return []  # no predictions: nothing to judge a stream by
        tpot_at: dict[str, float] = {}
        missing: list[tuple[RunningStream, float]] = []
        for stream in streams:
            slo = stream.life.info.slo
            if slo is None or stream.output_left < settings.min_tokens_left:
                continue
            backend_id = stream.backend.backend_id
            here = tpot_at.get(backend_id)
            if here is None:
                here = tpot_at[backend_id] = latency.decode_tpot(stream.backend, now)
            if whole_tpot(stream, now, 0.0, here) > slo.tpot_s:
                missing.append((stream, here))
        missing.sort(key=lambda m: -m[0].output_left)
        moves: list[Move] = []
        taken: set[str] = set()
        for stream, here in missing:
            if len(moves) >= settings.max_moves:
                break
            move = self._best(latency, stream, here, taken, now)
            if move is not None:
                moves.append(move)
                taken.add(move.to.backend_id)
        return moves

    def _best(
        self,
        latency: LatencyModel,
        stream: RunningStream,
        here: float,
        taken: set[str],
        now: float,
    ) -> Move | None:
        """Where `stream` would finish soonest, among the moves worth their pause."""
        life, left, context = stream.life, stream.output_left, stream.context_tokens
        bound = life.info.slo.tpot_s  # type: ignore[union-attr]  # plan kept those with one
        best: Move | None = None
        for backend in self.scheduler.candidates(life.info, life.tried):
            if backend.backend_id in taken:
                continue
            there = latency.predict(backend, context, context, left, now)
            if there.interference_s > latency.stall_allowance(backend.backend_id):
                continue  # its prefill would break a protected stream there
            saved, pause = left * (here - there.tpot_s), there.ttft_s
            # what it costs: its own pause, and every stream there stalled by its prefill
            cost = pause + there.interference_s * backend.in_flight
            if saved < self.settings.min_gain * cost or saved <= 0:
                continue
            if whole_tpot(stream, now, pause, there.tpot_s) > bound:
                continue  # it would miss there too: the prefill would buy nothing
            if best is None or saved - pause > best.saved_s - best.pause_s:
                best = Move(stream, backend, saved, pause)
        return best
