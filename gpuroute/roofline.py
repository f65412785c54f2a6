"""Roofline speeds of one GPU type running one model: prefill, decode steps, KV capacity.

Kernel facts, not simulation: the router's cost priors, the simulator's engine model and
the fake engine all read the same numbers (the model is described in docs/simulator.md)."""

from __future__ import annotations

from gpuroute.gpus import GpuSpec
from gpuroute.models import ModelSpec
from gpuroute.prefix_blocks import BLOCK_TOKENS


class EngineParams:
    """Speeds of one GPU type running one model (derived once, shared by engines)."""

    def __init__(
        self,
        gpu: GpuSpec,
        model: ModelSpec,
        *,
        max_num_seqs: int = 256,
        memory_utilization: float = 0.9,
        mbu: float = 0.75,
        mfu: float = 0.55,
        step_overhead_s: float = 0.0015,
        prefill_overhead_s: float = 0.004,
        chunked_prefill: bool = True,
        max_num_batched_tokens: int | None = None,
    ) -> None:
        self.gpu, self.model = gpu, model
        self.max_num_seqs = max_num_seqs
        self.chunked_prefill = chunked_prefill
        # vLLM v1's API-server default: 8192 tokens per step on GPUs with >= 70 GiB, else 2048.
        default_budget = 8192 if gpu.memory_gb >= 70 else 2048
        self.max_num_batched_tokens = max_num_batched_tokens or default_budget
        if self.max_num_batched_tokens <= max_num_seqs and chunked_prefill:
            raise ValueError("max_num_batched_tokens must exceed max_num_seqs")
        kv_bytes = gpu.memory_gb * 1e9 * memory_utilization - model.weight_total_bytes
        self.kv_capacity_tokens = int(kv_bytes / model.kv_bytes_per_token)
        if self.kv_capacity_tokens < 2 * BLOCK_TOKENS:
            raise ValueError(
                f"model {model.name} does not fit on {gpu.name} ({gpu.memory_gb:g} GB): "
                f"{self.kv_capacity_tokens} tokens of KV cache left"
            )
        flops = gpu.fp16_tflops * 1e12 * mfu
        bandwidth = gpu.memory_bandwidth_tbs * 1e12 * mbu
        self.prefill_overhead_s = prefill_overhead_s
        self.prefill_linear_s = model.flops_per_token / flops
        self.prefill_quadratic_s = 2 * model.layers * model.hidden / flops
        self.step_overhead_s = step_overhead_s
        self.weights_read_s = model.weight_total_bytes / bandwidth
        self.kv_read_s_per_token = model.kv_bytes_per_token / bandwidth
        self.decode_compute_s_per_seq = model.flops_per_token / flops

    def prefill_s(self, tokens: float) -> float:
        return self.prefill_overhead_s + tokens * (
            self.prefill_linear_s + tokens * self.prefill_quadratic_s
        )

    def prefill_compute_s_per_token(self, tokens: float) -> float:
        """Mean compute per prompt token of an `tokens`-long prefill, without the fixed overhead."""
        return self.prefill_linear_s + tokens * self.prefill_quadratic_s

    def step_s(self, batch: int, ctx_tokens: float, prefill_compute_s: float = 0.0) -> float:
        memory = self.weights_read_s + ctx_tokens * self.kv_read_s_per_token
        compute = batch * self.decode_compute_s_per_seq + prefill_compute_s
        return self.step_overhead_s + (memory if memory > compute else compute)

    def saturation_batch(self, mean_tokens: float) -> int:
        """Batch size at saturation for requests holding `mean_tokens` of KV each."""
        return max(1, min(self.max_num_seqs, int(self.kv_capacity_tokens / max(mean_tokens, 1))))

    def decode_token_cost_s(self, mean_prompt: float, mean_output: float) -> float:
        """GPU-seconds per generated token at saturation: one step's time over its batch."""
        batch = self.saturation_batch(mean_prompt + mean_output)
        return self.step_s(batch, batch * (mean_prompt + mean_output / 2)) / batch
