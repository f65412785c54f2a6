"""What each attempt should take, how much slower each backend runs, and which attempts to
move: the sans-IO half of watching backends, shared by the live router
(router/attempts/watch.py adds the asyncio tasks and the relayed bytes) and the simulator
(which feeds it simulated time and the engine model's tokens).

Every attempt gets an expected duration when it starts (its GPU type's roofline at the load
it met, `GpuPace`); finished ones feed `SlownessTracker` their observed/expected ratio, and
streams in flight their pace over a window; `refresh` sets every backend's slowness; an
attempt still waiting for its first token is moved (`should_move`) off a backend that is
lost, ejected or `rescue_slowness` times slow once it waited twice its expected time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuroute.router.core.backend import Backend, BackendState
from gpuroute.router.core.lifetime import RequestLifetime
from gpuroute.router.core.scheduler import Scheduler
from gpuroute.router.core.slowness import SlownessTracker, rescue_suspect, should_rescue

# Streams are timed over windows of this length: over less, when a prefill's stall happened
# to land says more than the GPU's speed (8-token windows read healthy engines on the code
# trace as many times slow).
PACE_WINDOW_S = 2.0
PACE_TOKENS = 8  # nor less than this many tokens' expected time


@dataclass(frozen=True, slots=True)
class GpuPace:
    """A GPU type's roofline rates, as the router's priors hold them."""

    prefill_s_per_token: float
    decode_s_per_token: float  # a throughput cost: step time / the batch at saturation
    unloaded_tpot_s: float  # one sequence alone: the floor of time per output token


class Watcher:
    def __init__(
        self,
        scheduler: Scheduler,
        paces: dict[str, GpuPace],
        rescue_slowness: float,
        tracker: SlownessTracker | None = None,
    ) -> None:
        self.scheduler, self.paces = scheduler, paces
        self.rescue_slowness = rescue_slowness  # 0: never move an attempt
        self.slowness = tracker or SlownessTracker()
        self._window_from: float | None = None  # when the streams' current window began

    def expected_s(self, backend: Backend, prompt: int, output: float, batch: int) -> float:
        """Expected duration on this backend: its GPU type's roofline at the load it has."""
        pace = self.paces.get(backend.gpu_type)
        if pace is None:
            return 1.0  # unknown type: every request counts alike
        tpot = max(pace.unloaded_tpot_s, (batch + 1) * pace.decode_s_per_token)
        return prompt * pace.prefill_s_per_token + output * tpot

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

    def start(self, life: RequestLifetime, backend: Backend, now: float) -> float:
        """An attempt was booked on `backend` and sent; its clock (on `life.timing`) and its
        expected duration."""
        info = life.info
        output = self.scheduler.estimator.expected_output(
            info.model, info.max_tokens, info.prompt_tokens
        )
        batch = backend.in_flight - 1  # the ledger already counts this request
        expected = self.expected_s(backend, info.prompt_tokens, output, batch)
        pace = self.paces.get(backend.gpu_type)
        if life.latency is not None and pace is not None:
            # the wait in the engine's prefill queue the latency model predicted: load, so
            # a request still queued as predicted is neither slow nor to be rescued
            own_prefill = info.prompt_tokens * pace.prefill_s_per_token
            expected += max(life.latency.gpu_ttft_s - own_prefill, 0.0)
        life.timing = self.slowness.start(backend.backend_id, now, expected, batch)
        return expected

    def succeeded(
        self,
        life: RequestLifetime,
        backend: Backend,
        output: int,
        now: float,
        first_token_at: float | None = None,
    ) -> float | None:
        """The attempt finished well; returns observed/expected for outlier detection,
        judged at the batch it met when it started.

        A stream is judged by its decode alone (first token to end against its tokens'
        roofline time): its wait in the engine's prefill queue says how much work the
        backend was given, not how fast it runs, and counting it made the backend that
        takes the long prompts look slow (the live code-trace bench: an H100 at 2.4; the
        simulator's code scenarios: H100s at 15-22 from streams of 1-3 tokens)."""
        timing, life.timing = life.timing, None
        if timing is None:
            return None
        if first_token_at is not None and output < 4:
            # too few tokens to time a decode, and the rest was its wait in the prefill
            # queue (load): it says only that the backend still finishes requests
            self.slowness.alive(timing.backend_id, now)
            return None
        if first_token_at is not None:
            expected = self.decode_expected_s(backend, output - 1, timing.batch, now, life)
            return self.slowness.finish(timing, now, expected, since=first_token_at)
        prompt = life.info.prompt_tokens
        expected = self.expected_s(backend, prompt, max(output, 1), timing.batch)
        ratio = self.slowness.finish(timing, now, expected)
        return ratio if output >= 4 else None

    def gave_up(self, life: RequestLifetime, now: float) -> None:
        """A moved attempt: it took at least this long, which is worth remembering (or the
        backend would look fine again the moment its stuck requests were moved)."""
        if life.timing is not None:
            self.slowness.finish(life.timing, now)
        life.timing = None

    def window_paces(
        self, now: float, streams: Iterable[tuple[Backend, float | None, float]]
    ) -> dict[str, list[float]] | None:
        """Once a window of PACE_WINDOW_S has passed (None before; then the next begins):
        each stream's observed/expected time for what it produced in it, per backend.
        `streams` gives each stream's backend, its tokens at the window's start (None: it
        began during the window) and now; it is read only when a window ends. The
        expectation is the GPU type's TPOT at the batch there, less the prefill
        interference (load, not a slow GPU); a stream that produced nothing counts as half
        a token, so a hung engine reads as very slow at once."""
        start = self._window_from
        if start is None or now - start < PACE_WINDOW_S:
            self._window_from = now if start is None else start
            return None
        self._window_from, elapsed = now, now - start
        latency = self.scheduler.latency
        paces: dict[str, list[float]] = {}
        for backend, before, after in streams:
            tpot = self.expected_s(backend, 0, 1, max(backend.in_flight - 1, 0))
            if before is None or elapsed < PACE_TOKENS * tpot:
                continue  # not the whole window, or too few of its tokens to time
            share = 0.0 if latency is None else latency.interference(backend.backend_id, now)
            pace = elapsed * (1.0 - share) / (max(after - before, 0.5) * tpot)
            paces.setdefault(backend.backend_id, []).append(pace)
        return paces

    def refresh(
        self,
        now: float,
        lifetimes: Iterable[RequestLifetime],
        paces: dict[str, list[float]] | None = None,
    ) -> None:
        """Recompute every backend's slowness: from a window's stream paces (None: no
        window ended), the requests running now and those finished."""
        backends = self.scheduler.backends
        if paces is not None:
            for backend in backends:
                backend_id = backend.backend_id
                self.slowness.observe_pace(backend_id, now, paces.get(backend_id, ()))
        # read only when a backend stopped finishing (SlownessTracker._done_ratios)
        timings = (life.timing for life in lifetimes if life.timing is not None)
        slowness = self.slowness.refresh(now, [b.backend_id for b in backends], timings)
        for backend in backends:
            backend.slowness = slowness.get(backend.backend_id, 1.0)

    def suspect(self, backend: Backend) -> bool:
        """Whether `should_move` may move an attempt off `backend` when its host is not
        lost (`rescue_suspect`): attempts elsewhere need no look."""
        return rescue_suspect(
            ejected=backend.state is BackendState.EJECTED,
            slowness=backend.slowness,
            rescue_slowness=self.rescue_slowness,
        )

    def should_move(
        self,
        life: RequestLifetime,
        backend: Backend,
        waited_s: float,
        expected_s: float,
        lost: bool,
    ) -> bool:
        """Move an attempt still waiting for its first token elsewhere? (`should_rescue`)
        Off a lost host always; off a slow one only when another backend could take it:
        moving one with nowhere to go (the only engine of its model, a canary's version)
        would fail it instead of letting it wait."""
        rescue = should_rescue(
            lost=lost,
            ejected=backend.state is BackendState.EJECTED,
            slowness=backend.slowness,
            rescue_slowness=self.rescue_slowness,
            waited_s=waited_s,
            expected_s=expected_s,
        )
        return rescue and (lost or self._elsewhere(life))

    def _elsewhere(self, life: RequestLifetime) -> bool:
        backends, tried = self.scheduler.backends, life.tried
        return any(
            b.backend_id not in tried for m in life.info.models for b in backends.routable(m)
        )
