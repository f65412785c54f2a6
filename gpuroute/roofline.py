"""Roofline speeds of one GPU type running one model: prefill, decode steps, KV capacity.

Kernel facts, not simulation: the router's cost priors, the simulator's engine model and
the fake engine all read the same numbers (the model is described in docs/simulator.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.gpus import GpuSpec
from gpuroute.models import ModelSpec
from gpuroute.prefix_blocks import BLOCK_TOKENS

# one all-reduce's fixed cost (launch and link latency), NCCL on NVLink's order of magnitude
ALLREDUCE_LATENCY_S = 10e-6
ACTIVATION_BYTES = 2  # BF16 activations are what tensor parallelism all-reduces
DEFAULT_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization: its share of each GPU


def usable_bytes(
    gpu: GpuSpec, gpus: int, memory_utilization: float = DEFAULT_MEMORY_UTILIZATION
) -> float:
    """What an engine of `gpus` GPUs may fill: its weights, then its KV cache."""
    return gpus * gpu.memory_gb * 1e9 * memory_utilization


def kv_capacity_tokens(
    gpu: GpuSpec,
    model: ModelSpec,
    gpus: int,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
) -> int:
    """Tokens of KV cache an engine holds once its weights are loaded (negative: the weights
    alone do not fit). vLLM starts only when one whole sequence fits in it."""
    room = usable_bytes(gpu, gpus, memory_utilization) - model.weight_total_bytes
    return int(room / model.kv_bytes_per_token)


@dataclass(frozen=True, slots=True)
class EngineKind:
    """What an engine instance is: a GPU type, how many of them (tensor × pipeline
    parallel) and the model shape it runs. Priors and learned corrections are per kind."""

    gpu: str
    model: str
    tp: int = 1
    pp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def key(self, default_model: str) -> str:
        """Its name in tables and metrics: the GPU type alone for one GPU running the default
        model (so a single-model fleet reads as before), else e.g. `H200-tp4/llama-3.1-70b`."""
        name = self.gpu + (f"-tp{self.tp}" if self.tp > 1 else "")
        name += f"-pp{self.pp}" if self.pp > 1 else ""
        return name if self.model == default_model else f"{name}/{self.model}"


class EngineParams:
    """Speeds of one engine instance, a GPU type × tensor (and pipeline) parallel degree
    running one model (derived once, shared by engines).

    Tensor parallelism splits weights, KV cache and compute over `tp` GPUs and adds two
    all-reduces of the step's activations per layer (ring: 2·(tp−1)/tp of the bytes over
    each GPU's link, plus a fixed latency). Pipeline parallelism pools `pp` GPUs' memory;
    a token still passes every stage in turn, so a step takes as long as on one GPU."""

    def __init__(
        self,
        gpu: GpuSpec,
        model: ModelSpec,
        *,
        tp: int = 1,
        pp: int = 1,
        max_num_seqs: int = 256,
        memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
        mbu: float = 0.75,
        mfu: float = 0.55,
        step_overhead_s: float = 0.0015,
        prefill_overhead_s: float = 0.004,
        chunked_prefill: bool = True,
        max_num_batched_tokens: int | None = None,
        name: str | None = None,
    ) -> None:
        if tp < 1 or pp < 1:
            raise ValueError("tensor and pipeline parallel degrees must be >= 1")
        self.gpu, self.model, self.tp, self.pp = gpu, model, tp, pp
        self.name = name or gpu.name  # its engine kind's key in reports (EngineKind.key)
        self.max_num_seqs = max_num_seqs
        self.chunked_prefill = chunked_prefill
        # vLLM v1's API-server default: 8192 tokens per step on GPUs with >= 70 GiB, else 2048.
        default_budget = 8192 if gpu.memory_gb >= 70 else 2048
        self.max_num_batched_tokens = max_num_batched_tokens or default_budget
        if self.max_num_batched_tokens <= max_num_seqs and chunked_prefill:
            raise ValueError("max_num_batched_tokens must exceed max_num_seqs")
        gpus = tp * pp
        self.kv_capacity_tokens = kv_capacity_tokens(gpu, model, gpus, memory_utilization)
        if self.kv_capacity_tokens < 2 * BLOCK_TOKENS:
            raise ValueError(
                f"model {model.name} does not fit on "
                f"{gpu.name if gpus == 1 else f'{gpus} × {gpu.name}'} "
                f"({gpus * gpu.memory_gb:g} GB): "
                f"{self.kv_capacity_tokens} tokens of KV cache left"
            )
        flops = gpu.fp16_tflops * 1e12 * mfu * tp
        bandwidth = gpu.memory_bandwidth_tbs * 1e12 * mbu * tp
        # all-reduce per token of a step, and per step (two per layer on every stage)
        ring = 2 * (tp - 1) / tp
        allreduces = 2 * model.layers if tp > 1 else 0
        self.comm_s_per_token = (
            allreduces * ring * model.hidden * ACTIVATION_BYTES / (gpu.interconnect_gbs * 1e9)
        )
        self.comm_step_s = allreduces * ALLREDUCE_LATENCY_S
        self.prefill_overhead_s = prefill_overhead_s
        self.prefill_linear_s = model.flops_per_token / flops
        self.prefill_quadratic_s = 2 * model.layers * model.hidden / flops
        self.step_overhead_s = step_overhead_s
        self.weights_read_s = model.weight_total_bytes / bandwidth
        self.kv_read_s_per_token = model.kv_bytes_per_token / bandwidth
        self.decode_compute_s_per_seq = model.flops_per_token / flops

    def prefill_s(self, tokens: float) -> float:
        return (
            self.prefill_overhead_s
            + self.comm_step_s
            + tokens
            * (self.prefill_linear_s + self.comm_s_per_token + tokens * self.prefill_quadratic_s)
        )

    def prefill_compute_s_per_token(self, tokens: float) -> float:
        """Mean compute per prompt token of an `tokens`-long prefill, without the fixed overhead."""
        return self.prefill_linear_s + self.comm_s_per_token + tokens * self.prefill_quadratic_s

    def step_s(self, batch: int, ctx_tokens: float, prefill_compute_s: float = 0.0) -> float:
        memory = self.weights_read_s + ctx_tokens * self.kv_read_s_per_token
        compute = batch * self.decode_compute_s_per_seq + prefill_compute_s
        step = self.step_overhead_s + (memory if memory > compute else compute)
        if self.comm_step_s:  # tensor parallel: the step's all-reduces (none on one GPU)
            step += self.comm_step_s + batch * self.comm_s_per_token
        return step

    def saturation_batch(self, mean_tokens: float) -> int:
        """Batch size at saturation for requests holding `mean_tokens` of KV each."""
        return max(1, min(self.max_num_seqs, int(self.kv_capacity_tokens / max(mean_tokens, 1))))

    def decode_token_cost_s(self, mean_prompt: float, mean_output: float) -> float:
        """GPU-seconds per generated token at saturation: one step's time over its batch."""
        batch = self.saturation_batch(mean_prompt + mean_output)
        return self.step_s(batch, batch * (mean_prompt + mean_output / 2)) / batch
