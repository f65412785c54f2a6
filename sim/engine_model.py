"""Performance model of one inference engine with continuous batching (vLLM-like), sans-IO.

Time is an argument. The model is exact between events: while the batch does not change,
every running sequence gains one token per decode step, so a shared "token clock" `v`
advances at 1/step_time and a request finishes when `v` reaches its end mark. That makes
each arrival or completion O(log n) instead of one event per token, which is what lets the
fleet simulator run a million requests; the live fake engine reads the same clock to pace
its SSE chunks.

Model (documented in docs/simulator.md):
- prefill of uncached prompt tokens is compute-bound: (2·P·n + 2·L·n²·d) / (FLOPS·mfu),
  one request at a time (FCFS);
- chunked prefill (vLLM v1's default): each step carries the running batch's decode tokens
  plus up to `max_num_batched_tokens - batch` prompt tokens, so decoding goes on while a
  prompt is prefilled and a step costs overhead + max(memory, decode + chunk compute);
  with `chunked_prefill=False` a prefill runs alone and pauses every decode;
- a decode step is memory-bound: overhead + max(weights + KV read / (BW·mbu), compute);
- KV cache capacity in tokens = (memory × utilisation − weights) / KV bytes per token; a
  request reserves prompt + output tokens when admitted and waits (FCFS) until they fit;
- prefix cache: LRU of 512-token blocks in the KV memory; cached leading blocks skip prefill;
- hooks: `set_slowdown` (thermal throttling, gray failure), `crash` / `recover`, `abort`
  (a client that went away)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from gpuroute.sim.prefix_cache import PrefixCache

from gpuroute.prefix_blocks import BLOCK_TOKENS
from gpuroute.roofline import EngineParams

EPS_TOKENS = 1e-6


class EngineRequest:
    """A request inside an engine; times are filled in as it progresses."""

    __slots__ = (
        "adapter",
        "admitted_at",
        "arrival",
        "blocks",
        "cached_tokens",
        "ctx",
        "finished_at",
        "first_token_at",
        "output_tokens",
        "prompt_tokens",
        "rid",
        "submitted_at",
        "v_end",
        "v_start",
    )

    def __init__(
        self,
        rid: int,
        prompt_tokens: int,
        output_tokens: int,
        arrival: float,
        blocks: Sequence[int] = (),
        adapter: str | None = None,
    ) -> None:
        self.rid = rid
        self.adapter = adapter  # a LoRA adapter's name (sim/adapters.py), None: the base model
        self.prompt_tokens = prompt_tokens
        self.output_tokens = max(1, output_tokens)
        self.arrival = arrival
        self.blocks = blocks
        self.cached_tokens = 0
        self.submitted_at = -1.0  # when it reached this engine (a retry: the last one)
        self.admitted_at = -1.0
        self.first_token_at = -1.0
        self.finished_at = -1.0
        self.v_start = 0.0
        self.v_end = 0.0
        self.ctx = prompt_tokens + self.output_tokens / 2  # mean context while decoding


class EngineModel:
    """One engine's queue, KV cache, prefix cache and batch, advanced by events."""

    def __init__(
        self,
        params: EngineParams,
        *,
        prefix_caching: bool = True,
        report_first_tokens: bool = False,
    ) -> None:
        self.params = params
        # requests whose first token came in the last on_event (drained by the caller)
        self.first_tokens: list[EngineRequest] | None = [] if report_first_tokens else None
        self.chunked = params.chunked_prefill
        self.kv_capacity = params.kv_capacity_tokens
        self.prefix_cache = PrefixCache(self.kv_capacity // BLOCK_TOKENS if prefix_caching else 0)
        self.waiting: deque[EngineRequest] = deque()
        self.prefilling: EngineRequest | None = None
        self.prefill_end = 0.0
        self.prefill_left = 0.0  # chunked mode: prompt tokens still to prefill
        self.prefill_cost = 0.0  # chunked mode: compute seconds per prompt token
        self.chunk = 0.0  # chunked mode: prompt tokens carried by each step now
        self.running: list[tuple[float, int, EngineRequest]] = []
        self.v = 0.0
        self.last = 0.0
        self.ctx_sum = 0.0
        self.kv_used = 0
        self.kv_peak = 0
        self.busy_s = 0.0  # time spent prefilling or decoding (what nvidia-smi calls util)
        self.step = params.step_s(0, 0.0)
        self.slowdown = 1.0
        self.down = False

    # -- observation -----------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running) + (self.prefilling is not None)

    def kv_usage(self) -> float:
        return self.kv_used / self.kv_capacity

    def _decoding(self) -> bool:
        return bool(self.running) and (self.prefilling is None or self.chunked)

    def next_event_time(self) -> float | None:
        if self.down:
            return None
        decode_end = None
        running, prefilling = self.running, self.prefilling
        if running and (prefilling is None or self.chunked):  # decoding (inlined: per event)
            decode_end = self.last + (running[0][0] - self.v) * self.step
        if prefilling is None:
            return decode_end
        if decode_end is None or self.prefill_end < decode_end:
            return self.prefill_end
        return decode_end

    def tokens_generated(self, req: EngineRequest, now: float) -> int:
        """Tokens `req` has produced by `now` (the first comes with prefill)."""
        if req.first_token_at < 0 or now < req.first_token_at:
            return 0
        if req.finished_at >= 0:
            return req.output_tokens
        v = self.v
        if self._decoding():
            v += (now - self.last) / self.step
        return min(req.output_tokens, 1 + int(v - req.v_start + EPS_TOKENS))

    def fits(self, req: EngineRequest) -> bool:
        return req.prompt_tokens + req.output_tokens <= self.kv_capacity

    # -- inputs ----------------------------------------------------------------------------
    def submit(self, req: EngineRequest, now: float) -> bool:
        """Queue a request; False (and nothing queued) if it can never fit or we are down."""
        if self.down or not self.fits(req):
            return False
        self._advance(now)
        req.submitted_at = now
        self.waiting.append(req)
        if self.prefilling is None:
            self._start_next(now)
            self._reschedule(now)
        return True

    def on_event(self, now: float) -> list[EngineRequest]:
        """Process whatever is due at `now`; returns the requests that finished."""
        self._advance(now)
        finished: list[EngineRequest] = []
        req = self.prefilling
        if req is not None and (
            self.prefill_end <= now or (self.chunked and self.prefill_left <= EPS_TOKENS)
        ):
            self.prefilling = None
            req.first_token_at = now
            if self.first_tokens is not None:
                self.first_tokens.append(req)
            if req.output_tokens <= 1:
                self._release(req, now, finished)
            else:
                self._join(req)
        running = self.running
        while running and running[0][0] <= self.v + EPS_TOKENS:
            done = heapq.heappop(running)[2]
            self.ctx_sum -= done.ctx
            self._release(done, now, finished)
        if self.prefilling is None:
            self._start_next(now)
        self._reschedule(now)
        return finished

    def set_slowdown(self, factor: float, now: float) -> None:
        """Throttling or a gray failure: everything runs `factor` times slower from `now`."""
        if factor <= 0:
            raise ValueError("slowdown factor must be > 0")
        self._advance(now)
        if self.prefilling is not None and not self.chunked:
            self.prefill_end = now + (self.prefill_end - now) * factor / self.slowdown
        self.slowdown = factor
        self._reschedule(now)

    def abort(self, req: EngineRequest, now: float) -> bool:
        """The client went away: `req` leaves the queue, the prefill or the batch, and its
        KV cache is freed (as vLLM aborts a request whose connection closed). False when
        it is not here (finished, or never admitted)."""
        self._advance(now)
        if req in self.waiting:
            self.waiting.remove(req)
            if self.prefilling is None:  # it may have been the head that waited for KV
                self._start_next(now)
                self._reschedule(now)
            return True
        if req is self.prefilling:
            self.prefilling = None
            self.prefill_left = 0.0
        else:
            index = next((i for i, e in enumerate(self.running) if e[2] is req), None)
            if index is None:
                return False
            self.running[index] = self.running[-1]
            self.running.pop()
            heapq.heapify(self.running)
            self.ctx_sum -= req.ctx
        req.finished_at = now
        self.kv_used -= req.prompt_tokens + req.output_tokens
        if self.prefilling is None:
            self._start_next(now)
        self._reschedule(now)
        return True

    def crash(self, now: float) -> list[EngineRequest]:
        """The engine dies: every queued and running request is lost; returns them."""
        self._advance(now)
        lost = list(self.waiting) + [entry[2] for entry in self.running]
        if self.prefilling is not None:
            lost.append(self.prefilling)
        self.waiting.clear()
        self.running.clear()
        self.prefilling = None
        self.prefill_left = 0.0
        self.ctx_sum = 0.0
        self.kv_used = 0
        self.prefix_cache.clear()
        self.down = True
        return lost

    def recover(self, now: float) -> None:
        self.down = False
        self.last = now
        self._reschedule(now)

    # -- internals -------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        dt = now - self.last
        if dt <= 0:
            return  # a live caller may be a hair behind the last event; time never rewinds
        self.last = now
        prefilling = self.prefilling
        decoding = bool(self.running) and (prefilling is None or self.chunked)  # _decoding
        if decoding:
            self.v += dt / self.step
        if prefilling is not None:
            if self.chunked:
                self.prefill_left -= dt * self.chunk / self.step
            self.busy_s += dt
        elif decoding:
            self.busy_s += dt

    def _reschedule(self, now: float) -> None:
        """Recompute the step time (and a chunked prefill's end) after the batch changed."""
        params, batch = self.params, len(self.running)
        if self.prefilling is not None and self.chunked:
            left = max(self.prefill_left, EPS_TOKENS)
            self.chunk = min(params.max_num_batched_tokens - batch, left)
            compute = self.chunk * self.prefill_cost
            self.step = params.step_s(batch, self.ctx_sum, compute) * self.slowdown
            self.prefill_end = now + left / self.chunk * self.step
        else:
            self.step = params.step_s(batch, self.ctx_sum) * self.slowdown

    def _join(self, req: EngineRequest) -> None:
        req.v_start = self.v
        req.v_end = self.v + req.output_tokens - 1
        heapq.heappush(self.running, (req.v_end, req.rid, req))
        self.ctx_sum += req.ctx

    def _release(self, req: EngineRequest, now: float, finished: list[EngineRequest]) -> None:
        req.finished_at = now
        self.kv_used -= req.prompt_tokens + req.output_tokens
        finished.append(req)

    def _start_next(self, now: float) -> None:
        """Admit the head of the queue into prefill if the batch and KV cache have room."""
        if not self.waiting or len(self.running) >= self.params.max_num_seqs:
            return
        req = self.waiting[0]
        need = req.prompt_tokens + req.output_tokens
        if self.kv_used + need > self.kv_capacity:
            return  # head-of-line waits for KV, as vLLM's FCFS scheduler does
        self.waiting.popleft()
        self.kv_used += need
        if self.kv_used > self.kv_peak:
            self.kv_peak = self.kv_used
        if req.blocks:
            hit_blocks = self.prefix_cache.match(req.blocks)
            req.cached_tokens = min(hit_blocks * BLOCK_TOKENS, req.prompt_tokens - 1)
            self.prefix_cache.insert(req.blocks)
        req.admitted_at = now
        self.prefilling = req
        uncached = req.prompt_tokens - req.cached_tokens
        if self.chunked:
            self.prefill_left = float(uncached)
            self.prefill_cost = self.params.prefill_compute_s_per_token(uncached)
        else:
            self.prefill_end = now + self.params.prefill_s(uncached) * self.slowdown
