"""The live router's backend watch in simulated time: every attempt gets its expected
duration, finished requests and streams' paces feed slowness, and attempts still waiting for
their first token on a backend that turned bad are moved (rescued), all through the router's
own sans-IO `Watcher` (router/core/watching.py). The engine model stands in for the relay:
it says how many tokens each stream has produced."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.lifetime import Lifetimes, RequestLifetime
from gpuroute.router.core.watching import GpuPace, Watcher
from gpuroute.sim.engine_model import EngineModel, EngineRequest
from gpuroute.sim.fleet import GpuTypeProfile

# the roofline priors' reference request (router/backends/priors.py): one sequence's step
REFERENCE_CONTEXT = 1000 + 250 / 2


@dataclass(slots=True)
class SimAttempt:
    """What the watch keeps of a request's attempt, on its lifetime (`shell`)."""

    engine: int
    req: EngineRequest
    expected_s: float
    sent_at: float
    tokens: int | None = None  # what the stream had produced at the last window's start


def attempt_of(life: RequestLifetime) -> SimAttempt | None:
    shell = life.shell
    return shell if isinstance(shell, SimAttempt) else None


def gpu_paces(profiles: dict[str, GpuTypeProfile]) -> dict[str, GpuPace]:
    """The router's roofline rates for each GPU type of the simulated fleet."""
    return {
        gpu: GpuPace(
            p.prior.prefill_s_per_token,
            p.prior.decode_s_per_token,
            p.params.step_s(1, REFERENCE_CONTEXT),
        )
        for gpu, p in profiles.items()
    }


class SimWatch:
    def __init__(
        self,
        watcher: Watcher,
        engines: Sequence[EngineModel],
        backends: Sequence[Backend],
        lifetimes: Lifetimes,
        *,
        stream_paces: bool = False,
    ) -> None:
        self.watcher, self.engines, self.backends = watcher, engines, backends
        self.lifetimes = lifetimes
        self.stream_paces = stream_paces  # off: slowness from finished and stalled requests
        self.rescues = 0

    def sent(self, life: RequestLifetime, e: int, req: EngineRequest, now: float) -> None:
        backend = self.backends[e]
        expected = self.watcher.start(life, backend, now)
        life.shell = SimAttempt(e, req, expected, now)

    def succeeded(self, life: RequestLifetime, req: EngineRequest, now: float) -> float | None:
        attempt = attempt_of(life)
        life.shell = None
        if attempt is None:
            return None
        backend = self.backends[attempt.engine]
        output, first = req.output_tokens, req.first_token_at
        return self.watcher.succeeded(life, backend, output, now, first)

    def ended(self, life: RequestLifetime) -> None:
        """The attempt failed: nothing to learn from it (what its client had stays)."""
        life.timing = life.shell = None

    def gave_up(self, life: RequestLifetime, now: float) -> None:
        self.watcher.gave_up(life, now)
        life.shell = None

    def tick(self, now: float) -> list[RequestLifetime]:
        """Refresh every backend's slowness; returns the attempts to move now."""
        paces = (
            self.watcher.window_paces(now, self._stream_counts(now)) if self.stream_paces else None
        )
        self.watcher.refresh(now, self.lifetimes, paces)
        # only an attempt on a suspect backend may move (no host is lost in the simulator)
        suspects = {e for e, b in enumerate(self.backends) if self.watcher.suspect(b)}
        if not suspects:
            return []
        moved = []
        for life in self.lifetimes:
            attempt = attempt_of(life)
            if attempt is None or attempt.engine not in suspects or attempt.req.first_token_at >= 0:
                continue
            backend = self.backends[attempt.engine]
            waited = now - attempt.sent_at
            if self.watcher.should_move(life, backend, waited, attempt.expected_s, lost=False):
                moved.append(life)
        self.rescues += len(moved)
        return moved

    def _stream_counts(self, now: float) -> Iterator[tuple[Backend, float | None, float]]:
        """Each stream's backend and its tokens at the last window's start and now (the
        engine model counts them where the live watch counts relayed text)."""
        for life in self.lifetimes:
            attempt = attempt_of(life)
            if attempt is None or attempt.req.first_token_at < 0:
                continue
            before = attempt.tokens
            attempt.tokens = self.engines[attempt.engine].tokens_generated(attempt.req, now)
            yield self.backends[attempt.engine], before, attempt.tokens
