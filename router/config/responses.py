"""The `[responses]` section: the Responses API's conversation state, kept by the router
(router/responses/state.py) in Redis when `[redis]` is configured, else in this process."""

from __future__ import annotations

from pydantic import Field, model_validator

from gpuroute.config import StrictModel

MIB = 1024 * 1024


class ResponsesConfig(StrictModel):
    # false: bodies go to engines as they came, and the engine's own (per-process) state
    # answers previous_response_id; GET, DELETE and cancel by id are not served
    enabled: bool = True
    ttl_s: float = Field(default=3600.0, gt=0)  # a stored response is forgotten after this
    max_per_tenant: int = Field(default=1000, ge=1)  # beyond it the oldest is evicted
    max_bytes_per_tenant: int = Field(default=64 * MIB, ge=1)  # likewise, in stored bytes
    # one stored response (its object and the whole conversation it ends) at most; a larger
    # one is relayed but not stored (a follow-up to it gets 404)
    max_entry_bytes: int = Field(default=4 * MIB, ge=1024)

    @model_validator(mode="after")
    def _entry_fits(self) -> ResponsesConfig:
        if self.max_entry_bytes > self.max_bytes_per_tenant:
            raise ValueError("responses.max_entry_bytes must not exceed max_bytes_per_tenant")
        return self
