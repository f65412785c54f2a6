"""Request cost in GPU-seconds.

Cost on a GPU type = prompt tokens × prefill seconds/token + expected output tokens × decode
seconds/token, where decode seconds/token is the throughput cost (one step's time divided by
the batch it serves at saturation). The two rates are the GPU type's roofline priors; what
is learned online is the output length, per model and prompt length (output_length.py).
The rates are not learned: a router sees step times only through its streams, where queueing
and prefill interference inflate them (a short prompt's TTFT is one decode step), and a cost
that grows with load would steer work off the busiest GPU twice, once through the latency
model's queue and again through its price."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.router.core.output_length import OutputLengthModel


@dataclass(frozen=True, slots=True)
class GpuCostPrior:
    """Seconds of one GPU's time per prompt token and per generated token."""

    prefill_s_per_token: float
    decode_s_per_token: float

    def __post_init__(self) -> None:
        if self.prefill_s_per_token <= 0 or self.decode_s_per_token <= 0:
            raise ValueError("per-token costs must be > 0")

    def seconds(self, prompt_tokens: float, output_tokens: float) -> float:
        return prompt_tokens * self.prefill_s_per_token + output_tokens * self.decode_s_per_token


# Used for GPU types nobody gave a prior for, divided by the backend's capacity weight.
REFERENCE_PRIOR = GpuCostPrior(prefill_s_per_token=1e-4, decode_s_per_token=1.5e-4)


class CostEstimator:
    """Prices a request per GPU type from its rates and the output length it learns."""

    def __init__(
        self,
        priors: dict[str, GpuCostPrior] | None = None,
        *,
        default_output_tokens: float = 256.0,
        alpha: float = 0.05,
        reference: GpuCostPrior = REFERENCE_PRIOR,
        exact_max_tokens: bool = False,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if default_output_tokens <= 0:
            raise ValueError("default_output_tokens must be > 0")
        self._rates = dict(priors or {})
        self.output = OutputLengthModel(default_output_tokens, alpha)
        self.default_output_tokens = default_output_tokens
        # max_tokens is the output length, not a cap (the simulator's oracle runs)
        self.exact_max_tokens = exact_max_tokens
        self.reference = reference

    def expected_output(
        self, model: str, max_tokens: int | None, prompt_tokens: float | None = None
    ) -> float:
        """Expected generated tokens: the mean learned for prompts of this length (the
        model's overall mean without one), capped by the request's max_tokens."""
        if max_tokens is not None and self.exact_max_tokens:
            return float(max_tokens)
        mean = self.output.expected(model, prompt_tokens)
        if max_tokens is not None and max_tokens < mean:
            return float(max_tokens)
        return mean

    def rates(self, gpu_type: str) -> GpuCostPrior | None:
        return self._rates.get(gpu_type)

    def add_rates(self, kind: str, prior: GpuCostPrior) -> None:
        """A new engine kind's rates (kept as they are for a kind known already)."""
        self._rates.setdefault(kind, prior)

    def seconds(
        self, gpu_type: str, capacity: float, prompt_tokens: float, output_tokens: float
    ) -> float:
        """GPU-seconds the request costs on one backend of `gpu_type` with `capacity` weight."""
        rates = self._rates.get(gpu_type)
        if rates is not None:
            return rates.seconds(prompt_tokens, output_tokens)
        return self.reference.seconds(prompt_tokens, output_tokens) / capacity

    def observe_output(
        self, model: str, output_tokens: int, prompt_tokens: float | None = None
    ) -> None:
        self.output.observe(model, prompt_tokens, output_tokens)
