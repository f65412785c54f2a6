"""What the latency model starts from for one GPU type: the engine's step arithmetic with
the roofline's constants (router/backends/priors.py builds them per served model)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpuroute.roofline import EngineParams


@dataclass(frozen=True, slots=True)
class LatencyPrior:
    """One GPU type running the served model, in seconds (from the roofline)."""

    step_overhead_s: float
    weights_read_s: float
    kv_read_s_per_token: float
    decode_compute_s_per_seq: float
    prefill_linear_s: float
    prefill_quadratic_s: float
    prefill_overhead_s: float
    chunk_tokens: int  # prompt tokens one step may carry (vLLM's max_num_batched_tokens)
    max_num_seqs: int = 256  # the engine's batch limit: beyond it, requests wait for a slot
    kv_capacity_tokens: float = float("inf")  # KV cache, in tokens

    @classmethod
    def from_engine(cls, params: EngineParams) -> LatencyPrior:
        return cls(
            params.step_overhead_s,
            params.weights_read_s,
            params.kv_read_s_per_token,
            params.decode_compute_s_per_seq,
            params.prefill_linear_s,
            params.prefill_quadratic_s,
            params.prefill_overhead_s if not params.chunked_prefill else 0.0,
            params.max_num_batched_tokens if params.chunked_prefill else 1 << 30,
            params.max_num_seqs,
            params.kv_capacity_tokens,
        )

    def scaled(self, factor: float) -> LatencyPrior:
        """The same engine `factor` times slower (every time, none of the limits)."""
        if factor == 1.0:
            return self
        return replace(
            self,
            step_overhead_s=self.step_overhead_s * factor,
            weights_read_s=self.weights_read_s * factor,
            kv_read_s_per_token=self.kv_read_s_per_token * factor,
            decode_compute_s_per_seq=self.decode_compute_s_per_seq * factor,
            prefill_linear_s=self.prefill_linear_s * factor,
            prefill_quadratic_s=self.prefill_quadratic_s * factor,
            prefill_overhead_s=self.prefill_overhead_s * factor,
        )

    def decode_step_s(self, batch: int, ctx_tokens: float) -> float:
        memory = self.weights_read_s + ctx_tokens * self.kv_read_s_per_token
        compute = batch * self.decode_compute_s_per_seq
        return self.step_overhead_s + (memory if memory > compute else compute)

    def slot_wait_s(
        self, in_flight: int, kv_tokens: float, request_kv: float, output: float, step_s: float
    ) -> float:
        """Time until a full engine (batch limit or KV cache) frees room for one more. The
        requests in flight hold `kv_tokens`, a mean of m each; of them, only as many run as
        the batch limit and the KV cache hold (the rest wait, FCFS), and the running finish
        at about running / (output x step) per second, each freeing m. Room is short by the
        requests over the batch limit or by the KV over capacity, counted in m."""
        mean_kv = kv_tokens / in_flight if in_flight else request_kv
        short = max(
            in_flight + 1 - self.max_num_seqs,
            (kv_tokens + request_kv - self.kv_capacity_tokens) / mean_kv,
        )
        if short <= 0:
            return 0.0
        running = min(in_flight, self.max_num_seqs, self.kv_capacity_tokens / mean_kv)
        return short * output * step_s / max(running, 1.0)

    def prefill_s(self, tokens: float, step_s: float) -> tuple[float, float]:
        """(prefill time, its excess over the plain decode steps it rides in)."""
        chunks = max(1, math.ceil(tokens / self.chunk_tokens))
        compute = tokens * (self.prefill_linear_s + tokens * self.prefill_quadratic_s)
        total = self.prefill_overhead_s + max(
            chunks * step_s, compute + chunks * self.step_overhead_s
        )
        return total, total - chunks * step_s
