"""The `[usage]` section: per-tenant usage records for billing (router/usage/records.py),
apart from the recorder so that loading a config imports no Redis client."""

from __future__ import annotations

from pydantic import Field

from gpuroute.config import StrictModel


class UsageConfig(StrictModel):
    """Whether usage is recorded, how often it reaches Redis, and how long it is kept."""

    enabled: bool = True
    # how often a replica adds what it counted to Redis's hourly records (and on shutdown)
    flush_interval_s: float = Field(default=5.0, gt=0, le=3600)
    retention_days: float = Field(default=40.0, gt=0, le=732)  # hours older are dropped
    # a flush is done only once this many Redis replicas acknowledged it (Redis WAIT);
    # until then it is sent again under its marker, so a failover loses none (0: the primary)
    replica_acks: int = Field(default=0, ge=0, le=16)
