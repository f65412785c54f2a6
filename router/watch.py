"""Watching backends through the requests they serve: expected durations, slowness, and
attempts still waiting for a first byte (which can be moved off a backend that turned bad).

The decisions live in the sans-IO core (`SlownessTracker`); this shell feeds it times and
owns the asyncio side: the attempt tasks it may cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from gpuroute.router.core.backend import Backend, BackendState
from gpuroute.router.core.lifetime import Lifetimes, RequestLifetime
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.core.slowness import SlownessTracker, should_rescue
from gpuroute.router.priors import GpuPriors

from gpuroute.relay import BYTES_PER_TOKEN, ResponseTally

# Streams are timed over windows of this length: over less, when a prefill's stall happened
# to land says more than the GPU's speed (8-token windows read healthy engines on the code
# trace as many times slow).
PACE_WINDOW_S = 2.0
PACE_TOKENS = 8  # nor less than this many tokens' expected time
# Streamed text is counted in bytes (ResponseTally.content); BYTES_PER_TOKEN (the relay's)
# turns bytes into tokens. Paces are compared only with each other, so it need not be
# exact, only the same for all.


@dataclass(slots=True)
class AttemptWatch:
    """What the watch keeps of a request's current attempt, on its lifetime (`shell`)."""

    backend: Backend
    expected_s: float
    task: asyncio.Task | None = None  # while it waits for its first byte
    waiting_since: float = 0.0
    rescued: bool = False  # its task was cancelled to move it elsewhere
    tally: ResponseTally | None = None  # once streaming: the relay's live count of its text
    # None: it began during the window, or its events were not sized yet when it began
    content: int | None = None


def watched(life: RequestLifetime) -> AttemptWatch | None:
    shell = life.shell
    return shell if isinstance(shell, AttemptWatch) else None


class BackendWatch:
    def __init__(
        self,
        scheduler: Scheduler,
        priors: dict[str, GpuPriors],
        clock: Callable[[], float],
        rescue_slowness: float,
        lifetimes: Lifetimes,
    ) -> None:
        self.scheduler = scheduler
        self.lifetimes = lifetimes  # the requests in flight: their attempts are watched
        self.priors = priors
        self.clock = clock
        self.rescue_slowness = rescue_slowness
        self.slowness = SlownessTracker()
        # Set by the membership shell: True for a backend Consul calls critical or gone
        # whose agent has gone silent too, i.e. a host that crashed or is cut off.
        self.lost: Callable[[str], bool] = lambda _backend_id: False
        self._window_from: float | None = None
        self.rescues = 0

    def expected_s(self, backend: Backend, prompt: int, output: float, batch: int) -> float:
        """Expected duration on this backend: its GPU type's roofline at the load it has."""
        priors = self.priors.get(backend.gpu_type)
        if priors is None:
            return 1.0  # unknown type: every request counts alike
        tpot = max(priors.unloaded_tpot_s, (batch + 1) * priors.cost.decode_s_per_token)
        return prompt * priors.cost.prefill_s_per_token + output * tpot

    def decode_expected_s(
        self,
        backend: Backend,
        tokens: int,
        batch: int,
        now: float,
        life: RequestLifetime | None = None,
    ) -> float:
        """Expected decode time of `tokens` at the load the backend has, the prefill chunks
        riding in its steps included: under a prefill-heavy load every stream there decodes
        slower, which is load, not a sick GPU (the live code-trace bench read it as 3-4x
        slowness). On average that is the latency model's interference; a short answer
        meets a long prefill or none, so its own stall (the prefill booked there after it)
        is counted when larger."""
        plain = self.expected_s(backend, 0, tokens, batch)
        latency = self.scheduler.latency
        if latency is None:
            return plain
        stretched = plain / (1.0 - latency.interference(backend.backend_id, now))
        return max(stretched, plain + latency.stall_met(life.latency if life else None))

    def started(self, life: RequestLifetime, backend: Backend) -> float:
        """An attempt was booked on `backend`; returns its expected duration."""
        info = life.info
        output = self.scheduler.estimator.expected_output(
            info.model, info.max_tokens, info.prompt_tokens
        )
        expected = self.expected_s(backend, info.prompt_tokens, output, backend.in_flight - 1)
        life.timing = self.slowness.start(backend.backend_id, self.clock(), expected)
        life.shell = AttemptWatch(backend, expected)
        return expected

    def succeeded(
        self,
        life: RequestLifetime,
        backend: Backend,
        output: int,
        batch: int,
        first_token_at: float | None = None,
    ) -> float | None:
        """The attempt finished well; returns observed/expected for outlier detection.

        A stream is judged by its decode alone (first token to end against its tokens'
        roofline time): its wait in the engine's prefill queue says how much work the
        backend was given, not how fast it runs, and counting it made the backend that
        takes the long prompts look slow (the live code-trace bench: an H100 at 2.4)."""
        now = self.clock()
        timing, life.timing, life.shell = life.timing, None, None
        if timing is None:
            return None
        if first_token_at is not None and output >= 4:
            expected = self.decode_expected_s(backend, output - 1, batch, now, life)
            return self.slowness.finish(timing, now, expected, since=first_token_at)
        expected = self.expected_s(backend, life.info.prompt_tokens, max(output, 1), batch)
        ratio = self.slowness.finish(timing, now, expected)
        return ratio if output >= 4 else None

    def forget(self, life: RequestLifetime) -> None:
        """The attempt ended with nothing to learn (a failure, a disconnect)."""
        life.timing = life.shell = None

    def gave_up(self, life: RequestLifetime) -> None:
        """A rescued attempt: it took at least this long, which is worth remembering (or the
        backend would look fine again the moment its stuck requests were moved)."""
        if life.timing is not None:
            self.slowness.finish(life.timing, self.clock())
        life.timing = life.shell = None

    # -- streams in flight -----------------------------------------------------------------
    def streaming(self, life: RequestLifetime, tally: ResponseTally) -> None:
        """A stream's first bytes reached its client: time its pace from the next window."""
        watch = watched(life)
        if watch is not None:
            watch.tally = tally

    def _stream_paces(self, now: float) -> dict[str, list[float]] | None:
        """Once a window has passed (None before): each stream's observed/expected time for
        the text it relayed in it, per backend, for the streams that ran the whole window.
        The expectation is `decode_expected_s`'s on average (batch, prefill interference):
        load, not a slow GPU. A stream that relayed nothing counts as half a token, so a hung
        engine reads as very slow at once."""
        start, latency = self._window_from, self.scheduler.latency
        if start is None or now - start < PACE_WINDOW_S:
            self._window_from = now if start is None else start
            return None
        self._window_from, elapsed = now, now - start
        paces: dict[str, list[float]] = {}
        for life in self.lifetimes:
            stream = watched(life)
            if stream is None or stream.tally is None:
                continue
            content = stream.content
            stream.content = stream.tally.content if stream.tally.skeleton is not None else None
            backend = stream.backend
            tpot = self.expected_s(backend, 0, 1, max(backend.in_flight - 1, 0))
            if content is None or elapsed < PACE_TOKENS * tpot:
                continue
            tokens = max((stream.tally.content - content) / BYTES_PER_TOKEN, 0.5)
            share = 0.0 if latency is None else latency.interference(backend.backend_id, now)
            paces.setdefault(backend.backend_id, []).append(
                elapsed * (1.0 - share) / (tokens * tpot)
            )
        return paces

    # -- attempts waiting for their first byte ---------------------------------------------
    def waiting(self, life: RequestLifetime) -> None:
        """Its attempt waits for a first byte in this task (which a rescue may cancel)."""
        watch = watched(life)
        if watch is not None:
            watch.task, watch.waiting_since = asyncio.current_task(), self.clock()

    def done_waiting(self, life: RequestLifetime) -> None:
        watch = watched(life)
        if watch is not None:
            watch.task = None

    def take_rescue(self, life: RequestLifetime) -> bool:
        """Was this attempt's cancellation a rescue (True, consumed) or the client leaving?"""
        watch = watched(life)
        if watch is None or not watch.rescued:
            return False
        watch.rescued = False
        return True

    # -- tick ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Recompute how much slower than expected each backend runs."""
        backends, now = self.scheduler.backends, self.clock()
        paces = self._stream_paces(now)
        if paces is not None:
            for backend in backends:
                self.slowness.observe_pace(
                    backend.backend_id, now, paces.get(backend.backend_id, ())
                )
        timings = [life.timing for life in self.lifetimes if life.timing is not None]
        slowness = self.slowness.refresh(now, [b.backend_id for b in backends], timings)
        for backend in backends:
            backend.slowness = slowness.get(backend.backend_id, 1.0)

    def rescue(self) -> int:
        """Cancel the waiting attempts the core's `should_rescue` moves. Nothing reached their
        clients, so the attempts loop retries them elsewhere. Returns how many."""
        if not self.rescue_slowness:
            return 0
        now, moved = self.clock(), 0
        lost: dict[str, bool] = {}
        for life in self.lifetimes:
            watch = watched(life)
            if watch is None or watch.task is None or watch.rescued:
                continue
            backend = watch.backend
            is_lost = lost.get(backend.backend_id)
            if is_lost is None:
                is_lost = lost[backend.backend_id] = self.lost(backend.backend_id)
            if should_rescue(
                lost=is_lost,
                ejected=backend.state is BackendState.EJECTED,
                slowness=backend.slowness,
                rescue_slowness=self.rescue_slowness,
                waited_s=now - watch.waiting_since,
                expected_s=watch.expected_s,
            ):
                watch.rescued = True
                watch.task.cancel()
                moved += 1
        self.rescues += moved
        return moved
