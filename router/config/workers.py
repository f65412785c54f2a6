"""The `[workers]` section: processes serving the public port together."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gpuroute.config import StrictModel


class WorkersConfig(StrictModel):
    # processes serving the public port together (SO_REUSEPORT); "auto": one per usable core
    count: int | Literal["auto"] = Field(default=1)
    share_interval_s: float = Field(default=0.02, gt=0)  # outstanding work between them

    @field_validator("count")
    @classmethod
    def _positive(cls, count: int | str) -> int | str:
        if isinstance(count, int) and not 1 <= count <= 256:
            raise ValueError('expected 1 to 256, or "auto"')
        return count
