"""How much slower each backend runs than the rest of the fleet, from real requests.

Every request gets an expected duration when it starts (its GPU type's roofline at the load
it met). A backend's ratio is an EWMA of observed/expected over its finished requests. A
backend that finished nothing for `stall_s` while holding requests (hung, or so slow that
nothing completes) is judged by the median elapsed/expected of those when that is larger.
Ages alone are not used otherwise: after load shifts, one backend's requests are simply
younger than another's, and treating age as slowness moved work off healthy backends
(measured). Slowness = that ratio / the other backends' median ratio, at least 1.

Finished requests lag: after a GPU turns slow, the streams it holds finish with ratios that
are mostly their healthy past, and judged by those a 10x slow H100 stayed under the deadband
for tens of seconds and won its share back (the live bench's fault run). So while backends
have streams in flight their *pace* is preferred: each stream timed over what it relayed
since the last look (`observe_pace`), compared with the other backends' paces only (its
unit, content bytes per expected token, is not the finished ratios' unit).

Least outstanding work multiplies a backend's score by its slowness and `slo_aware`
stretches its predictions, so a gray failure loses its share within seconds, long before
outlier ejection (which needs an interval of completions) acts."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PACE_WINDOWS = 3


@dataclass(slots=True, frozen=True)
class Timing:
    """One attempt's clock: where it runs, since when, and how long it should take. Its
    `RequestLifetime` holds it; the tracker reads the running ones at `refresh`."""

    backend_id: str
    started: float
    expected_s: float
    batch: int = 0  # the backend's other requests when it started (the load it met)


class SlownessTracker:
    def __init__(
        self,
        *,
        alpha: float = 0.5,
        cap: float = 100.0,
        min_samples: int = 3,
        stall_s: float = 5.0,
        deadband: float = 2.0,
    ) -> None:
        if not 0 < alpha <= 1 or cap < 1 or min_samples < 1 or stall_s < 0:
            raise ValueError("need 0 < alpha <= 1, cap >= 1, min_samples >= 1, stall_s >= 0")
        self.alpha, self.cap, self.min_samples, self.stall_s = alpha, cap, min_samples, stall_s
        # Below this, differences are load noise, not a sick backend: acting on them skewed
        # healthy traffic (TTFT p50 0.22 s -> 0.5 s in the live bench).
        self.deadband = deadband
        self._last_finish: dict[str, float] = {}
        self._ratio: dict[str, float] = {}  # finished-request EWMA per backend
        self._samples: dict[str, int] = {}
        # backend -> the medians of its last PACE_WINDOWS windows of streams, and when
        self._paces: dict[str, tuple[deque[float], float]] = {}
        self.slowness: dict[str, float] = {}

    @staticmethod
    def start(backend_id: str, now: float, expected_s: float, batch: int = 0) -> Timing:
        return Timing(backend_id, now, max(expected_s, 1e-6), batch)

    def finish(
        self,
        timing: Timing,
        now: float,
        expected_s: float | None = None,
        since: float | None = None,
    ) -> float:
        """A request ended; `expected_s` (known output length) replaces the start estimate,
        and `since` the start, when the caller measured a phase of it (its decode). Returns
        its observed/expected ratio. Failures and disconnects just drop their timing."""
        backend_id, started = timing.backend_id, timing.started
        expected = expected_s or timing.expected_s
        ratio = (now - (started if since is None else since)) / max(expected, 1e-6)
        previous = self._ratio.get(backend_id)
        self._ratio[backend_id] = (
            ratio if previous is None else previous + self.alpha * (ratio - previous)
        )
        self._samples[backend_id] = self._samples.get(backend_id, 0) + 1
        self._last_finish[backend_id] = now
        return ratio

    def alive(self, backend_id: str, now: float) -> None:
        """A request ended there that says nothing of its speed: the backend still
        finishes requests (it is not stalled)."""
        self._last_finish[backend_id] = now

    def observe_pace(self, backend_id: str, now: float, ratios: Sequence[float]) -> None:
        """The observed/expected time of what each of a backend's streams relayed over the
        last window. Their median is robust to a client that reads slowly; a backend's pace
        is the median of its last PACE_WINDOWS windows running, so one window that met a
        long prefill's stall does not count. Fewer than `min_samples` streams break the run."""
        if len(ratios) < self.min_samples:
            self._paces.pop(backend_id, None)
            return
        windows = self._paces.get(backend_id, (deque(maxlen=PACE_WINDOWS), now))[0]
        windows.append(statistics.median(ratios))
        self._paces[backend_id] = (windows, now)

    def _pace(self, backend_id: str, now: float) -> float | None:
        entry = self._paces.get(backend_id)
        if entry is None or len(entry[0]) < PACE_WINDOWS or now - entry[1] > self.stall_s:
            return None
        return statistics.median(entry[0])

    def refresh(
        self, now: float, backend_ids: Iterable[str], timings: Iterable[Timing] = ()
    ) -> dict[str, float]:
        """Recompute every backend's slowness (call on the router's tick); `timings`: the
        attempts running now (their lifetimes')."""
        ids = list(backend_ids)
        paces = {b: p for b in ids if (p := self._pace(b, now)) is not None}
        if len(paces) < 2:  # a pace alone in the fleet has no yardstick
            paces = {}
        done, stalled = self._done_ratios(now, ids, timings)
        self.slowness = {}
        # past EXACT_UP_TO backends the yardstick is everyone's median: sorted once, not
        # once per backend (a 1,000-GPU fleet sorted 1,000 ratios 1,000 times a tick)
        pace_median, done_median = _fleet_median(paces), _fleet_median(done)
        for backend_id in ids:
            by_pace = _relative(paces, backend_id, pace_median)
            by_done = _relative(done, backend_id, done_median)
            if by_pace is None and by_done is None:
                continue
            # the pace when there is one, unless the backend also stopped finishing
            if by_pace is not None and backend_id not in stalled:
                relative = by_pace
            else:
                relative = max(r for r in (by_pace, by_done) if r is not None)
            self.slowness[backend_id] = (
                min(self.cap, relative) if relative >= self.deadband else 1.0
            )
        return self.slowness

    def _done_ratios(
        self, now: float, ids: list[str], timings: Iterable[Timing]
    ) -> tuple[dict[str, float], set[str]]:
        """Each backend's finished requests' ratio, and those that stopped finishing. The
        running requests' ages are read only when one has stopped (they matter only
        there): a tick of a busy fleet does not walk every request in flight."""
        running: dict[str, list[float]] | None = None
        done: dict[str, float] = {}
        stalled: set[str] = set()
        for backend_id in ids:
            is_stalled = now - self._last_finish.get(backend_id, -float("inf")) > self.stall_s
            if is_stalled and running is None:
                running = {}
                for t in timings:
                    ages = running.setdefault(t.backend_id, [])
                    ages.append((now - t.started) / t.expected_s)
            ages = running.get(backend_id) if is_stalled and running is not None else None
            ratio = self._done_ratio(backend_id, is_stalled, ages)
            if ratio is not None:
                done[backend_id], is_stalled = ratio
                if is_stalled:
                    stalled.add(backend_id)
        return done, stalled

    def _done_ratio(
        self, backend_id: str, stalled: bool, ages: list[float] | None
    ) -> tuple[float, bool] | None:
        """Its finished requests' ratio, and whether it stopped finishing (then the median
        age of its running requests when that is larger)."""
        finished = (
            self._ratio.get(backend_id)
            if self._samples.get(backend_id, 0) >= self.min_samples
            else None
        )
        if stalled and ages and len(ages) >= self.min_samples:
            in_flight = statistics.median(ages)
            return (in_flight if finished is None else max(finished, in_flight)), True
        return None if finished is None else (finished, False)


# up to this many backends the yardstick leaves the backend out (in a pair, the median of
# both would cap anyone's slowness at 2); past it, one leaves the median unmoved
EXACT_UP_TO = 64


def _fleet_median(ratios: dict[str, float]) -> float | None:
    """Everyone's median ratio, the yardstick of a fleet past EXACT_UP_TO (None below)."""
    return statistics.median(ratios.values()) if len(ratios) > EXACT_UP_TO else None


def _relative(
    ratios: dict[str, float], backend_id: str, fleet_median: float | None
) -> float | None:
    """The backend's ratio over the others' typical one (None: it has none, or nobody
    else has one: alone, a backend is its own yardstick). `fleet_median`: `_fleet_median`
    of the same ratios (None: the others' median is taken without the backend)."""
    ratio = ratios.get(backend_id)
    if ratio is None:
        return None
    if len(ratios) < 2:
        return 1.0
    if fleet_median is None:
        typical = statistics.median(r for b, r in ratios.items() if b != backend_id)
    else:
        typical = fleet_median
    return ratio / max(typical, 1e-9)


def should_rescue(
    *,
    lost: bool,
    ejected: bool,
    slowness: float,
    rescue_slowness: float,
    waited_s: float,
    expected_s: float,
) -> bool:
    """Move an attempt still waiting for its first byte elsewhere? At once from a lost host
    (nothing will come back); from one ejected or `rescue_slowness` times slow once past
    twice its expected duration (the rest may be about to finish); never when
    `rescue_slowness` is 0."""
    if not rescue_slowness:
        return False
    if lost:
        return True
    bad = rescue_suspect(ejected=ejected, slowness=slowness, rescue_slowness=rescue_slowness)
    return bad and waited_s > 2 * expected_s


def rescue_suspect(*, ejected: bool, slowness: float, rescue_slowness: float) -> bool:
    """Whether `should_rescue` may move an attempt off a backend whose host is not lost:
    it is ejected or `rescue_slowness` times slow (never when that is 0). A scan of the
    attempts in flight looks only at those on such backends."""
    return bool(rescue_slowness) and (ejected or slowness >= rescue_slowness)
