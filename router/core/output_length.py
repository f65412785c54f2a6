"""Expected output length, learned online and conditioned on the prompt's length.

Output length is the largest unknown in a request's cost, and the long ones make the tail.
The prompt's length is known before routing and often tells a lot: in Azure's 2023
conversation trace, prompts of 700-1,300 tokens get ~400-token answers and the rest ~100.
So the model keeps one mean per quarter-octave of prompt length, shrunk towards the model's
overall mean while a bucket has few samples (a bucket never seen predicts the overall mean).
Buckets average over 10x more samples than the overall mean: they are noisier and drift
no faster than the workload's mix does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BUCKETS_PER_OCTAVE = 4
BUCKET_SLOWER = 10.0  # a bucket's EWMA weight is the overall one's / this


def prompt_bucket(prompt_tokens: float) -> int:
    """Quarter-octave index: each bucket spans a factor of 2^(1/4) ≈ 1.19 (861-1,023 tokens
    is one bucket, 1,024-1,217 the next)."""
    return int(BUCKETS_PER_OCTAVE * math.log2(max(prompt_tokens, 1.0)))


@dataclass(slots=True)
class _Mean:
    """An EWMA that is a plain running mean until it has seen 1/alpha samples."""

    value: float = 0.0
    count: int = 0

    def add(self, sample: float, alpha: float) -> None:
        self.count += 1
        self.value += max(alpha, 1.0 / self.count) * (sample - self.value)


class OutputLengthModel:
    """Mean generated tokens per (model, prompt-length bucket), with shrinkage."""

    def __init__(self, default: float, alpha: float, prior_weight: float = 50.0) -> None:
        if default <= 0 or not 0 < alpha <= 1 or prior_weight < 0:
            raise ValueError("default must be > 0, alpha in (0, 1], prior_weight >= 0")
        self.default = default
        self.alpha = alpha
        # samples a bucket needs before its own mean counts as much as the model's
        self.prior_weight = prior_weight
        self._overall: dict[str, _Mean] = {}
        self._buckets: dict[tuple[str, int], _Mean] = {}

    def overall(self, model: str) -> float:
        mean = self._overall.get(model)
        return self.default if mean is None else mean.value

    def expected(self, model: str, prompt_tokens: float | None) -> float:
        overall = self.overall(model)
        if prompt_tokens is None:
            return overall
        bucket = self._buckets.get((model, prompt_bucket(prompt_tokens)))
        if bucket is None:
            return overall
        n = min(bucket.count, BUCKET_SLOWER / self.alpha)  # an EWMA's effective sample size
        return (n * bucket.value + self.prior_weight * overall) / (n + self.prior_weight)

    def observe(self, model: str, prompt_tokens: float | None, output_tokens: float) -> None:
        self._overall.setdefault(model, _Mean()).add(output_tokens, self.alpha)
        if prompt_tokens is not None:
            key = (model, prompt_bucket(prompt_tokens))
            self._buckets.setdefault(key, _Mean()).add(output_tokens, self.alpha / BUCKET_SLOWER)
