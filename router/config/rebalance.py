"""The `[rebalance]` section: streams predicted to miss their TPOT move to a backend with
room (router/core/rebalance.py). Simulated only for now: the live router refuses it on."""

from __future__ import annotations

from gpuroute.router.core.rebalance import RebalanceSettings
from pydantic import Field, model_validator

from gpuroute.config import StrictModel

CORE = RebalanceSettings()  # the core's defaults


class RebalanceConfig(StrictModel):
    """The core's RebalanceSettings as a config section (its defaults are the core's)."""

    enabled: bool = False
    max_moves_per_tick: int = Field(default=CORE.max_moves, ge=1, le=64)
    # a move's predicted saving over its cost (its pause: the queue and the re-prefill
    # there; and the stall that prefill adds to the streams running there)
    min_gain: float = Field(default=CORE.min_gain, ge=1.0)
    # shorter rests are not worth a prefill
    min_tokens_left: int = Field(default=int(CORE.min_tokens_left), ge=1)

    def settings(self) -> RebalanceSettings:
        return RebalanceSettings(
            max_moves=self.max_moves_per_tick,
            min_gain=self.min_gain,
            min_tokens_left=self.min_tokens_left,
        )


class RouterRebalanceConfig(RebalanceConfig):
    """The live router's section: it does not move streams on purpose yet (the simulator
    does), so turning it on is an error rather than a setting that does nothing."""

    @model_validator(mode="after")
    def _not_live_yet(self) -> RouterRebalanceConfig:
        if self.enabled:
            raise ValueError(
                "rebalance.enabled: the live router does not move streams yet; the simulator"
                " does (a scenario's [rebalance])"
            )
        return self
