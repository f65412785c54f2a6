"""Multi-region scenarios (`gpuroute sim --scenario F` with a [global] section).

Regions with locations and jurisdictions, GPUs placed in regions (`[[gpus]] region`),
client groups (where clients are, what share of traffic they send, how many are bound to
their home jurisdiction), and events: a region outage or a flash crowd in one region."""

from __future__ import annotations

from typing import Literal

from gpuroute.global_.core.policy import MODES
from pydantic import Field, field_validator, model_validator

from gpuroute.config import StrictModel


class RegionSpec(StrictModel):
    name: str
    jurisdiction: str
    lat: float = Field(ge=-90, le=90)
    lon: float = Field(ge=-180, le=180)


class ClientGroup(StrictModel):
    region: str  # clients live around this region's location
    share: float = Field(gt=0)  # of the steady request rate (normalised over groups)
    bound: float = Field(default=0.0, ge=0, le=1)  # fraction bound to the home jurisdiction


class Event(StrictModel):
    kind: Literal["flash_crowd", "outage"]
    region: str
    at_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    factor: float = Field(default=8.0, gt=1)  # flash crowd: that group's rate multiplier


class GlobalSection(StrictModel):
    policies: list[str] = Field(default_factory=lambda: list(MODES))
    duration_s: float = Field(default=240.0, gt=0)
    report_period_s: float = Field(default=0.5, gt=0)
    saturation_delay_s: float = Field(default=2.0, gt=0)
    regions: list[RegionSpec] = Field(min_length=1)
    clients: list[ClientGroup] = Field(min_length=1)
    events: list[Event] = Field(default_factory=list)

    @field_validator("policies")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in MODES:
                raise ValueError(f"unknown global policy {name!r}; known: {', '.join(MODES)}")
        return value

    @model_validator(mode="after")
    def _regions_exist(self) -> GlobalSection:
        names = {r.name for r in self.regions}
        for where, region in [("clients", c.region) for c in self.clients] + [
            ("events", e.region) for e in self.events
        ]:
            if region not in names:
                raise ValueError(f"{where}: unknown region {region!r}")
        return self
