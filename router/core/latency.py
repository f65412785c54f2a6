"""Predicted TTFT and TPOT of a request on each backend, learned online (sans-IO).

The model is the engine's own arithmetic (docs/scheduling.md), started from the roofline
priors of the backend's GPU type and corrected by what the router observes:

- **TTFT** = the prefill queued ahead of it on that backend + its own uncached prefill.
  Engines prefill first come, first served, so the router keeps a virtual clock per backend,
  `prefill_until`, advanced by each request it sends there and pulled back to the truth when
  a request's first token arrives earlier or later than predicted.
- **TPOT** = one decode step with the running batch (weights plus the batch's KV read, or
  its compute when that is larger), stretched by prefill interference: prefill chunks ride
  in the same steps and lengthen them. The router measures, per backend, the share of time
  those extra seconds have taken recently (`interference`, a decaying sum of each booked
  prefill's time beyond plain decode steps over `window_s`); a decode then runs at
  step / (1 - interference).
- **Learning**: per GPU type, the ratio of observed to predicted TTFT and TPOT, as EWMAs of
  the log ratio (weight `alpha`: about 1/alpha requests to move most of the way; one sample
  moves it at most a factor 2^alpha), clamped to [1/8, 8] (TPOT: [0.5, 2]). They absorb
  what the roofline misses (a slower kernel, a busier host, a fake engine's time scale)
  within tens of requests of a GPU type. The fixed part of TTFT outside the GPU (HTTP hops)
  is learned apart, per GPU type, so that it does not enter the ratios. Corrections that
  make a type look slower than its prior can starve themselves of evidence (the requests
  they predict to miss are held back); `age` returns them towards the prior while that
  happens (router/core/latency_learning.py).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import NamedTuple

from gpuroute.router.core.backend import Backend
from gpuroute.router.core.latency_learning import Corrections
from gpuroute.router.core.latency_prior import LatencyPrior

MIN_TOKENS_TO_LEARN_TPOT = 16
MAX_INTERFERENCE = 0.8
# the fixed overhead is fitted only on requests sent to an engine running at most this share
# of its batch limit: on a busier one its own queue (a slot, KV, chunked prefill), which the
# model does not see, reads as overhead, and an overload taught every idle engine of the
# type a second of it
UNLOADED_SHARE = 1 / 8


class _BackendLoad:
    """What the router has put on one backend, as the latency model sees it."""

    __slots__ = (
        "ctx_tokens",
        "interference",
        "interference_at",
        "kv_tokens",
        "limits",
        "prefill_until",
        "protected",
        "shift",
        "stalled",
    )

    def __init__(self) -> None:
        self.prefill_until = 0.0
        self.shift = 0.0  # corrections applied to the queue so far (moves every booking)
        self.ctx_tokens = 0.0  # KV tokens of the requests in flight (prompt + half the output)
        self.kv_tokens = 0.0  # KV they reserve (prompt + whole expected output)
        self.interference = 0.0  # decaying sum of prefill seconds beyond decode steps
        self.interference_at = 0.0
        self.stalled = 0.0  # every booked prefill's seconds beyond decode steps, summed
        # protected streams: (`stalled` at which one would miss its TPOT, order, booking);
        # ended ones stay until popped or compacted, `protected` counts those in flight
        self.limits: list[tuple[float, int, LatencyBooking]] = []
        self.protected = 0


class Prediction(NamedTuple):
    """A request's predicted TTFT and TPOT on one backend (a tuple: built on every
    candidate of every decision, so cheap to make)."""

    ttft_s: float
    tpot_s: float
    # what booking the request there adds to that backend (computed once, with the rest)
    prefill_s: float = 0.0  # its own prefill, learned ratio applied
    interference_s: float = 0.0  # that prefill's time beyond the decode steps it rides in


@dataclass(slots=True, eq=False)
class LatencyBooking:
    """One request's booking on one backend (its `RequestLifetime` holds it)."""

    backend_id: str
    gpu_type: str
    ctx_tokens: float
    kv_tokens: float
    first_token_at: float | None  # predicted, in the queue's coordinates; None once it came
    shift: float  # the queue's correction when it was booked
    gpu_ttft_s: float  # its predicted TTFT less the fixed overhead: what the ratio scales
    tpot_s: float
    alone: bool  # nothing queued ahead of it: its TTFT is its prefill plus the overhead
    protected: int = -1  # its entry's order in the backend's stall limits (-1: none)
    stalled_at: float = 0.0  # the backend's `stalled` once this request was booked
    open: bool = True  # False once `finish` released it


class LatencyModel:
    def __init__(
        self,
        priors: dict[str, LatencyPrior],
        *,
        window_s: float = 20.0,
        alpha: float = 0.05,
    ) -> None:
        if window_s <= 0 or not 0 < alpha <= 1:
            raise ValueError("window_s must be > 0 and alpha in (0, 1]")
        if not priors:
            raise ValueError("the latency model needs the priors of at least one GPU type")
        self.priors = dict(priors)
        # a GPU type without priors is assumed as slow as the slowest one known
        self.slowest = max(self.priors.values(), key=lambda p: p.prefill_linear_s)
        self.window_s = window_s
        self.alpha = alpha
        self.learned = Corrections(alpha)
        # the learned corrections' tables, read on every prediction (updated in place)
        self.ttft_ratio = self.learned.ttft_ratio
        self.tpot_ratio = self.learned.tpot_ratio
        self.overhead_s = self.learned.overhead_s  # fixed TTFT outside the GPU, per GPU type
        self._load: dict[str, _BackendLoad] = {}
        self._order = itertools.count()
        self.protected_streams = 0  # in flight with a stall allowance (stall_allowance)

    def _state(self, backend_id: str) -> _BackendLoad:
        state = self._load.get(backend_id)
        if state is None:
            state = self._load[backend_id] = _BackendLoad()
        return state

    def _decayed(self, state: _BackendLoad, now: float) -> float:
        return state.interference * math.exp((state.interference_at - now) / self.window_s)

    def _share(self, state: _BackendLoad, now: float) -> float:
        if not state.interference:
            return 0.0
        window = self.window_s
        decayed = state.interference * math.exp((state.interference_at - now) / window)
        return min(decayed / window, MAX_INTERFERENCE)

    def interference(self, backend_id: str, now: float) -> float:
        """The share of recent time prefill chunks have added to this backend's steps."""
        state = self._load.get(backend_id)
        return 0.0 if state is None else self._share(state, now)

    def predict(
        self,
        backend: Backend,
        uncached_prompt: float,
        prompt_tokens: float,
        output_tokens: float,
        now: float,
    ) -> Prediction:
        """TTFT and TPOT on `backend` of a request of `prompt_tokens` (`uncached_prompt` of
        them still to prefill) expecting `output_tokens`. Work other routers put there (the
        agent's report, or peers' shared ledger) waits ahead of it too: this router's queue
        clock cannot see it."""
        gpu_type = backend.gpu_type
        prior = self.priors.get(gpu_type, self.slowest)
        state = self._load.get(backend.backend_id)
        wait = backend.others_work
        ctx = prompt_tokens + output_tokens / 2
        kv = interference = 0.0
        if state is not None:
            if state.prefill_until > now:
                wait += state.prefill_until - now
            ctx += state.ctx_tokens
            kv = state.kv_tokens
            if state.interference:
                interference = self._share(state, now)
        in_flight = backend.in_flight
        step = prior.decode_step_s(in_flight + 1, ctx)
        prefill, excess = prior.prefill_s(uncached_prompt, step)
        request_kv = prompt_tokens + output_tokens
        # the engine is full only past its batch limit or KV cache (slot_wait_s is 0 below)
        if in_flight >= prior.max_num_seqs or kv + request_kv > prior.kv_capacity_tokens:
            wait += prior.slot_wait_s(in_flight, kv, request_kv, output_tokens, step)
        # A gray failure (SlownessTracker: this backend, not its GPU type, runs that many
        # times slower than the fleet) stretches its own compute. Without it the filter
        # judged a 10x slow H100 by its type's ratio (bounded) and kept sending it streams.
        # The interference booked stays at the type's speed: the tracker's expected decode
        # counts it, and stretched it would excuse the very slowness it measures.
        slow = backend.slowness
        ratio = self.ttft_ratio.get(gpu_type, 1.0)
        prefill, excess = prefill * ratio * slow, excess * ratio
        tpot = self._stretched(step, backend, interference)
        overhead = self.overhead_s.get(gpu_type, 0.0)
        return Prediction(overhead + wait + prefill, tpot, prefill, excess)

    def decode_tpot(self, backend: Backend, now: float) -> float:
        """The TPOT its running streams decode at now: a step of its batch (no more than
        the engine runs at once) over the context booked there, stretched by prefill
        interference, its GPU type's learned ratio and its own slowness."""
        prior = self.priors.get(backend.gpu_type, self.slowest)
        state = self._load.get(backend.backend_id)
        ctx = state.ctx_tokens if state is not None else 0.0
        batch = max(min(backend.in_flight, prior.max_num_seqs), 1)
        step = prior.decode_step_s(batch, ctx)
        return self._stretched(step, backend, self.interference(backend.backend_id, now))

    def _stretched(self, step: float, backend: Backend, interference: float) -> float:
        """A decode step as `backend` takes it: stretched by prefill interference, its GPU
        type's learned TPOT ratio and its own slowness."""
        ratio = self.tpot_ratio.get(backend.gpu_type, 1.0)
        return step / (1.0 - interference) * ratio * backend.slowness

    def book(
        self,
        backend: Backend,
        prompt_tokens: float,
        output_tokens: float,
        now: float,
        predicted: Prediction,
        tpot_bound_s: float | None = None,
    ) -> LatencyBooking:
        """The request went to `backend` as `predicted` (from `predict` just before, at the
        same `now`): queue its prefill, count its KV and its interference. Given its TPOT
        bound (only when `output_tokens` is known, not a guess), its stream is protected:
        `stall_allowance` then says how much later prefill it can decode beside. Returns
        the booking, which `first_token` and `finish` take."""
        state = self._state(backend.backend_id)
        gpu_part = predicted.ttft_s - self.overhead_s.get(backend.gpu_type, 0.0)
        state.prefill_until = max(state.prefill_until, now) + predicted.prefill_s
        ctx_tokens = prompt_tokens + output_tokens / 2
        kv_tokens = prompt_tokens + output_tokens
        state.ctx_tokens += ctx_tokens
        state.kv_tokens += kv_tokens
        state.interference = self._decayed(state, now) + predicted.interference_s
        state.interference_at = now
        state.stalled += predicted.interference_s
        booking = LatencyBooking(
            backend.backend_id,
            backend.gpu_type,
            ctx_tokens,
            kv_tokens,
            state.prefill_until,
            state.shift,
            gpu_part,
            predicted.tpot_s,
            self._alone(backend, gpu_part, predicted.prefill_s),
            -1,
            state.stalled,
        )
        if tpot_bound_s is not None and output_tokens > 1:
            booking.protected = self._protect(
                state, predicted, output_tokens, tpot_bound_s, booking
            )
        return booking

    def _alone(self, backend: Backend, gpu_part: float, prefill_s: float) -> bool:
        """Nothing queued ahead of it (its TTFT is its prefill plus the overhead) on an
        engine with little else in flight: a point for the overhead's fit."""
        limit = self.priors.get(backend.gpu_type, self.slowest).max_num_seqs * UNLOADED_SHARE
        return gpu_part <= prefill_s * 1.05 and backend.in_flight <= max(1.0, limit)

    def _protect(
        self,
        state: _BackendLoad,
        predicted: Prediction,
        output_tokens: float,
        tpot_bound_s: float,
        booking: LatencyBooking,
    ) -> int:
        """Record the stall this stream can take: its tokens' slack under the TPOT bound.
        Prefill is first come, first served, so every prefill booked here after it runs
        while it decodes, each lengthening its steps by its chunks' extra seconds."""
        limits = state.limits
        if len(limits) > 64 and len(limits) > 4 * state.protected:
            limits[:] = [e for e in limits if self._live(e)]  # drop ended streams' entries
            heapq.heapify(limits)
        allowance = (output_tokens - 1) * max(tpot_bound_s - predicted.tpot_s, 0.0)
        order = next(self._order)
        heapq.heappush(limits, (state.stalled + allowance, order, booking))
        state.protected += 1
        self.protected_streams += 1
        return order

    @staticmethod
    def _live(entry: tuple[float, int, LatencyBooking]) -> bool:
        booking = entry[2]
        return booking.open and booking.protected == entry[1]

    def stall_allowance(self, backend_id: str) -> float:
        """Seconds of prefill beyond decode steps this backend can still take before a
        protected stream there misses its TPOT (inf when none is protected). A long
        prompt's chunks lengthen every running stream's steps, and a short answer has few
        tokens to spread that over: without this, one long prefill breaks them all."""
        state = self._load.get(backend_id)
        if state is None or not state.limits:
            return math.inf
        limits = state.limits
        while limits and not self._live(limits[0]):
            heapq.heappop(limits)  # that stream ended
        return limits[0][0] - state.stalled if limits else math.inf

    def stall_met(self, booking: LatencyBooking | None) -> float:
        """Seconds the prefills booked on its backend after it added to the steps it
        decoded in (0 once it ended, or for a request never booked): load it met, not a
        slow GPU."""
        state = self._load.get(booking.backend_id) if booking is not None else None
        if state is None or not booking.open:
            return 0.0
        return max(state.stalled - booking.stalled_at, 0.0)

    def first_token(self, booking: LatencyBooking, now: float, ttft_s: float | None = None) -> None:
        """The request's first token arrived: shift that backend's prefill queue by the error
        (FCFS: what was booked after it is that much earlier or later), learn the fixed
        overhead and the GPU type's TTFT ratio."""
        if not booking.open or booking.first_token_at is None:
            return
        state = self._load.get(booking.backend_id)
        if state is not None:
            # where the queue now expects it (earlier corrections moved it too)
            overhead = self.overhead_s.get(booking.gpu_type, 0.0)
            expected = booking.first_token_at + state.shift - booking.shift + overhead
            error = now - expected
            state.shift += error
            state.prefill_until = max(now, state.prefill_until + error)
        if ttft_s is not None and booking.gpu_ttft_s > 0:
            self.learned.learn_ttft(
                booking.gpu_type, booking.gpu_ttft_s, ttft_s, booking.alone, now
            )
        booking.first_token_at = None

    def finish(
        self,
        booking: LatencyBooking,
        tpot_s: float | None,
        in_flight_left: int,
        output_tokens: int = MIN_TOKENS_TO_LEARN_TPOT,
        now: float | None = None,
    ) -> None:
        """End of stream (or failure): release the KV tokens, learn TPOT when measured.

        A stream decodes beside whatever arrives after it, so the TPOT predicted when it
        was booked is compared as the mean of that prediction and the step the backend
        runs now that it ends: the load it decoded under. Against the booking alone, a
        burst (or a drain) after booking reads as a slow (or fast) GPU, and the ratio
        swings between its bounds with the traffic. A second finish changes nothing."""
        if not booking.open:
            return
        booking.open = False
        state = self._load.get(booking.backend_id)
        if booking.protected >= 0:
            self.protected_streams -= 1
            if state is not None:
                state.protected -= 1
        if state is not None:
            state.ctx_tokens = state.ctx_tokens - booking.ctx_tokens if in_flight_left else 0.0
            state.kv_tokens = state.kv_tokens - booking.kv_tokens if in_flight_left else 0.0
        if tpot_s is None or booking.tpot_s <= 0 or output_tokens < MIN_TOKENS_TO_LEARN_TPOT:
            return
        ratio = self.tpot_ratio.get(booking.gpu_type, 1.0)
        expected = booking.tpot_s
        if state is not None and now is not None:
            prior = self.priors.get(booking.gpu_type, self.slowest)
            step = prior.decode_step_s(in_flight_left + 1, state.ctx_tokens + booking.ctx_tokens)
            at_end = step / (1.0 - self.interference(booking.backend_id, now)) * ratio
            expected = (booking.tpot_s + at_end) / 2
        self.learned.learn_tpot(booking.gpu_type, tpot_s / expected, now)

    def age(self, now: float, busy: Collection[str], *, turned_away: bool) -> None:
        """See Corrections.age (called on the scheduler's tick)."""
        self.learned.age(now, busy, turned_away=turned_away)
