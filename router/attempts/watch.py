"""Watching backends through the requests they serve: expected durations, slowness, and
attempts still waiting for a first byte (which can be moved off a backend that turned bad).

The decisions live in the sans-IO core (`core/watching.py`, which the simulator drives too);
this shell feeds it times and relayed bytes and owns the asyncio side: the attempt tasks it
may cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuroute.router.backends.priors import GpuPriors
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.lifetime import Lifetimes, RequestLifetime
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.core.watching import GpuPace, Watcher

from gpuroute.relay.body import BYTES_PER_TOKEN, ResponseTally

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
        lost: Callable[[str], bool] = lambda _backend_id: False,
    ) -> None:
        self.scheduler = scheduler
        self.lifetimes = lifetimes  # the requests in flight: their attempts are watched
        self.clock = clock
        paces = {gpu: gpu_pace(p) for gpu, p in priors.items()}
        self.watcher = Watcher(scheduler, paces, rescue_slowness)  # the sans-IO half
        # From the membership shell: True for a backend Consul calls critical or gone
        # whose agent has gone silent too, i.e. a host that crashed or is cut off.
        self.lost = lost
        self.rescues = 0

    def add_kind(self, kind: str, priors: GpuPriors) -> None:
        """A new engine kind's roofline pace, for its streams' slowness."""
        self.watcher.paces.setdefault(kind, gpu_pace(priors))

    def started(self, life: RequestLifetime, backend: Backend) -> float:
        """An attempt was booked on `backend`; returns its expected duration."""
        expected = self.watcher.start(life, backend, self.clock())
        life.shell = AttemptWatch(backend, expected)
        return expected

    def succeeded(
        self, life: RequestLifetime, output: int, first_token_at: float | None = None
    ) -> float | None:
        """The attempt finished well; returns observed/expected for outlier detection."""
        watch, life.shell = watched(life), None
        if watch is None:
            life.timing = None
            return None
        return self.watcher.succeeded(life, watch.backend, output, self.clock(), first_token_at)

    def forget(self, life: RequestLifetime) -> None:
        """The attempt ended with nothing to learn (a failure, a disconnect)."""
        life.timing = life.shell = None

    def gave_up(self, life: RequestLifetime) -> None:
        """A rescued attempt: how long it took so far still informs slowness."""
        self.watcher.gave_up(life, self.clock())
        life.shell = None

    # -- streams in flight -----------------------------------------------------------------
    def streaming(self, life: RequestLifetime, tally: ResponseTally) -> None:
        """A stream's first bytes reached its client: time its pace from the next window."""
        watch = watched(life)
        if watch is not None:
            watch.tally = tally

    def _stream_counts(self) -> Iterator[tuple[Backend, float | None, float]]:
        """Each stream's backend and its relayed text in tokens at the last window's start
        (None: it began since, or its events were not sized yet) and now."""
        for life in self.lifetimes:
            stream = watched(life)
            if stream is None or stream.tally is None:
                continue
            before, tally = stream.content, stream.tally
            stream.content = tally.content if tally.skeleton is not None else None
            start = None if before is None else before / BYTES_PER_TOKEN
            yield stream.backend, start, tally.content / BYTES_PER_TOKEN

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
        now = self.clock()
        paces = self.watcher.window_paces(now, self._stream_counts())
        self.watcher.refresh(now, self.lifetimes, paces)

    def rescue(self) -> int:
        """Cancel the waiting attempts the core's `should_rescue` moves. Nothing reached their
        clients, so the attempts loop retries them elsewhere. Returns how many."""
        if not self.watcher.rescue_slowness:
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
            if self.watcher.should_move(
                life, backend, now - watch.waiting_since, watch.expected_s, is_lost
            ):
                watch.rescued = True
                watch.task.cancel()
                moved += 1
        self.rescues += moved
        return moved


def gpu_pace(priors: GpuPriors) -> GpuPace:
    cost = priors.cost
    return GpuPace(cost.prefill_s_per_token, cost.decode_s_per_token, priors.unloaded_tpot_s)
