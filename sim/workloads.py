"""Request streams for the simulator: built-in synthetic profiles and trace replay.

Synthetic profiles are fitted to the figures in ../shared/data/*/SOURCE.md (medians and
means → log-normal parameters) so the project runs where that data is absent:
- chat: Azure LLM 2023 conversation (prompt median 1,020 / mean 1,155; output 129 / 211);
- code: Azure LLM 2023 code (prompt 1,469 / 2,048; output 13 / 28), bursty arrivals;
- long-context: Mooncake conversation (prompt 6,909 / 12,035; output ≈ normal, mean 343);
- shared-prefix: Mooncake synthetic (prompt 11,587 / 15,325; output 69 / 149) built as
  multi-turn conversations whose turns extend the previous prompt, so blocks are shared."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpuroute.config import known_name
from gpuroute.prefix_blocks import BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class LogNormal:
    median: float
    mean: float
    low: int
    high: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma = math.sqrt(max(2 * math.log(self.mean / self.median), 1e-9))
        values = rng.lognormal(math.log(self.median), sigma, n)
        return np.clip(np.rint(values), self.low, self.high).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Normal:
    mean: float
    std: float
    low: int
    high: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        values = rng.normal(self.mean, self.std, n)
        return np.clip(np.rint(values), self.low, self.high).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Profile:
    prompt: LogNormal | Normal
    output: LogNormal | Normal
    bursty: bool = False
    conversations: bool = False  # multi-turn with shared prefixes


PROFILES: dict[str, Profile] = {
    "chat": Profile(LogNormal(1020, 1155, 8, 14050), LogNormal(129, 211, 1, 1000)),
    "code": Profile(LogNormal(1469, 2048, 8, 7437), LogNormal(13, 28, 1, 1899), bursty=True),
    "long-context": Profile(LogNormal(6909, 12035, 64, 126195), Normal(343, 180, 1, 2000)),
    "shared-prefix": Profile(
        LogNormal(11587, 15325, 64, 191378), LogNormal(69, 149, 1, 893), conversations=True
    ),
}


@dataclass(slots=True)
class Workload:
    """Requests sorted by arrival; `blocks[i]` are prompt-block hashes (empty if unknown)."""

    arrivals: np.ndarray  # seconds from the start
    prompts: np.ndarray
    outputs: np.ndarray
    blocks: list[tuple[int, ...]] = field(default_factory=list)
    sessions: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrivals)

    @property
    def span_s(self) -> float:
        return float(self.arrivals[-1] - self.arrivals[0]) if len(self) > 1 else 0.0

    def rescaled(self, factor: float) -> Workload:
        """Arrival times divided by `factor` (factor 2 = twice the rate)."""
        start = self.arrivals[0] if len(self) else 0.0
        arrivals = (self.arrivals - start) / factor
        return Workload(arrivals, self.prompts, self.outputs, self.blocks, self.sessions)

    def head(self, n: int) -> Workload:
        return Workload(
            self.arrivals[:n],
            self.prompts[:n],
            self.outputs[:n],
            self.blocks[:n],
            self.sessions[:n],
        )


def poisson_arrivals(rng: np.random.Generator, n: int, rate: float, bursty: bool) -> np.ndarray:
    """Arrival times at mean `rate`; bursty = on/off modulated (4× rate a quarter of the time)."""
    gaps = rng.exponential(1.0 / rate, n)
    if bursty:
        # Two-state modulation in blocks of 50 requests keeps the mean rate: 1/4 of the
        # requests arrive 4× faster, the rest slightly slower.
        on = (np.arange(n) // 50) % 4 == 0
        gaps = np.where(on, gaps / 4.0, gaps * (1 - 0.25 / 4) / 0.75)
    return np.cumsum(gaps)


def conversation_blocks(
    rng: np.random.Generator, prompts: np.ndarray, outputs: np.ndarray, new_fraction: float = 0.55
) -> tuple[list[tuple[int, ...]], list[str | None]]:
    """Multi-turn structure: a turn extends an open conversation's previous prompt + answer.

    Block ids are fresh integers (like Mooncake's remapped hashes); block 0 is a system
    prompt shared by everything."""
    next_block = 1
    open_convs: list[tuple[str, tuple[int, ...]]] = []
    blocks: list[tuple[int, ...]] = []
    sessions: list[str | None] = []
    coins = rng.random(len(prompts))
    picks = rng.random(len(prompts))
    for i, prompt in enumerate(prompts):
        want = max(1, math.ceil(int(prompt) / BLOCK_TOKENS))
        if open_convs and coins[i] >= new_fraction:
            slot = int(picks[i] * len(open_convs))
            session, history = open_convs[slot]
            base = history[:want]
        else:
            session, base, slot = f"conv-{i}", (0,), -1
        fresh = want - len(base)
        ids = (*base, *range(next_block, next_block + max(fresh, 0)))
        next_block += max(fresh, 0)
        carried = math.ceil(int(outputs[i]) / BLOCK_TOKENS)
        history = (*ids, *range(next_block, next_block + carried))
        next_block += carried
        if slot >= 0:
            open_convs[slot] = (session, history)
        else:
            open_convs.append((session, history))
            if len(open_convs) > 256:
                open_convs.pop(0)
        blocks.append(ids)
        sessions.append(session)
    return blocks, sessions


def synthetic(profile_name: str, n: int, rate: float, seed: int) -> Workload:
    profile = PROFILES[known_name(profile_name, PROFILES, "profile")]
    rng = np.random.default_rng(seed)
    prompts = profile.prompt.sample(rng, n)
    outputs = profile.output.sample(rng, n)
    arrivals = poisson_arrivals(rng, n, rate, profile.bursty)
    if profile.conversations:
        blocks, sessions = conversation_blocks(rng, prompts, outputs)
    else:
        blocks, sessions = [()] * n, [None] * n
    return Workload(arrivals, prompts, outputs, blocks, sessions)
