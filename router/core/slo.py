"""Service-level objectives per request: named classes with TTFT, TPOT and an optional
end-to-end deadline, most important first.

A request carries its class (from its API key, the `x-gpuroute-slo` header, or the default);
the scheduler places it where it is predicted to meet that class, and admission refuses the
least important class first. Defaults (docs/configuration.md): interactive chat wants the
first token within 0.5 s and reading speed or better (50 ms per token); standard traffic 2 s
and 100 ms; batch work only a deadline."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloClass:
    name: str
    ttft_s: float
    tpot_s: float
    e2e_s: float | None = None  # whole-answer deadline, when the caller has one

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an SLO class needs a name")
        if self.ttft_s <= 0 or self.tpot_s <= 0 or (self.e2e_s is not None and self.e2e_s <= 0):
            raise ValueError(f"SLO class {self.name!r}: ttft_s, tpot_s and e2e_s must be > 0")

    def met(self, ttft_s: float, tpot_s: float | None, e2e_s: float) -> bool:
        """Whether a served request met this class (what attainment counts); a one-token
        answer has no TPOT to miss."""
        if ttft_s > self.ttft_s or (tpot_s is not None and tpot_s > self.tpot_s):
            return False
        return self.e2e_s is None or e2e_s <= self.e2e_s


def time_per_output_token(first_token_at: float, end: float, output_tokens: float) -> float | None:
    """TPOT as SLOs count it: the time after the first token over the tokens after it
    (None for a one-token answer)."""
    if output_tokens <= 1:
        return None
    return (end - first_token_at) / (output_tokens - 1)


STANDARD = SloClass("standard", ttft_s=2.0, tpot_s=0.1)
DEFAULT_SLO_CLASSES: tuple[SloClass, ...] = (
    SloClass("interactive", ttft_s=0.5, tpot_s=0.05),
    STANDARD,
    SloClass("batch", ttft_s=60.0, tpot_s=0.5, e2e_s=600.0),
)
DEFAULT_SLO_CLASS = STANDARD.name


class SloClasses:
    """The configured classes, ranked (0 = most important), and which one is the default."""

    __slots__ = ("by_name", "classes", "default", "rank")

    def __init__(self, classes: Iterable[SloClass], default: str) -> None:
        self.classes: tuple[SloClass, ...] = tuple(classes)
        if not self.classes:
            raise ValueError("at least one SLO class")
        self.by_name = {c.name: c for c in self.classes}
        if len(self.by_name) != len(self.classes):
            raise ValueError("SLO class names must be distinct")
        if default not in self.by_name:
            raise ValueError(f"default SLO class {default!r} is not one of {self.names()}")
        self.default = self.by_name[default]
        self.rank = {c.name: i for i, c in enumerate(self.classes)}

    def names(self) -> Sequence[str]:
        return [c.name for c in self.classes]

    def get(self, name: str | None) -> SloClass:
        """The class named `name`; the default for None. Unknown names raise ValueError."""
        if name is None:
            return self.default
        try:
            return self.by_name[name]
        except KeyError:
            raise ValueError(
                f"unknown SLO class {name!r}; known: {', '.join(self.names())}"
            ) from None
