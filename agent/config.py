"""Node agent configuration (TOML), validated with errors that name the file and the key."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from gpuroute.agent.core.engine_facts import META_VALUE_MAX, Parallelism
from gpuroute.agent.engine_metrics import ENGINE_KINDS
from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from gpuroute.admin_guard import AdminToken, token_off_loopback
from gpuroute.config import (
    HttpUrlWithPort,
    StrictModel,
    TlsConfig,
    is_loopback,
    known_name,
    load_toml_model,
)
from gpuroute.gpus import DeclaresGpuTypes, GpuTypeName
from gpuroute.secrets import secret_forms

EngineKind = Annotated[str, AfterValidator(lambda v: known_name(v, ENGINE_KINDS, "engine kind"))]
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def _service_id(value: str) -> str:
    if not value or set(value) - _ID_CHARS:
        raise ValueError("use letters, digits and - _ . : only")
    return value


class EngineConfig(StrictModel):
    url: HttpUrlWithPort = "http://127.0.0.1:8000"
    kind: EngineKind = "vllm"
    # default: what the engine's /v1/models lists (the agent registers once it has answered)
    models: list[str] | None = Field(default=None, min_length=1)
    gpu: GpuTypeName
    # default: what the engine reports where it does (engine_facts.PARALLEL_PATHS), else
    # gpu_count / pipeline_parallel (an old config's gpu_count was one engine), else 1
    tensor_parallel: int | None = Field(default=None, ge=1, le=64)
    pipeline_parallel: int | None = Field(default=None, ge=1, le=64)
    # tensor_parallel x pipeline_parallel x data-parallel ranks (default: tp x pp)
    gpu_count: int | None = Field(default=None, ge=1)
    capacity: float | None = Field(default=None, gt=0)  # default: the router's GPU prior
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    models_path: str = "/v1/models"
    # how often /v1/models is read again (adapters load at run time); also on each restart
    models_interval_s: float = Field(default=30.0, ge=1)
    # A busy engine answers late: vLLM serves /health and /metrics from the event loop that
    # streams every token, and took 2 s to answer on a saturated CPU host. Too short a
    # timeout marks a busy engine down (two late probes in a row) and blinds its load.
    health_timeout_s: float = Field(default=5.0, gt=0)
    metrics_timeout_s: float = Field(default=5.0, gt=0)

    @field_validator("gpu_count")
    @classmethod
    def _gpus_hold_whole_engines(cls, count: int | None, info: ValidationInfo) -> int | None:
        tp, pp = info.data.get("tensor_parallel"), info.data.get("pipeline_parallel")
        per_rank = (tp or 1) * (pp or 1)
        if count is None or count % per_rank == 0:
            return count
        if tp is None:
            raise ValueError(f"{count} GPUs do not split into pipeline_parallel = {pp} stages")
        raise ValueError(
            f"{count} GPUs are not a whole number of engine ranks of tensor_parallel x "
            f"pipeline_parallel = {tp} x {pp or 1} = {per_rank} GPUs; set gpu_count = "
            "tensor_parallel x pipeline_parallel x data-parallel ranks"
        )

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 80

    @property
    def parallel(self) -> Parallelism:
        """The layout the config implies (engine_facts: the engine's report overrides it)."""
        pp = self.pipeline_parallel or 1
        if self.tensor_parallel is None:
            # before tensor_parallel, gpu_count GPUs were one engine (routers read it so)
            return Parallelism((self.gpu_count or pp) // pp, pp, 1)
        per_rank = self.tensor_parallel * pp
        return Parallelism(self.tensor_parallel, pp, (self.gpu_count or per_rank) // per_rank)

    @property
    def parallel_declared(self) -> bool:
        """Whether the config says anything about the layout (else no mismatch to report)."""
        keys = (self.tensor_parallel, self.pipeline_parallel, self.gpu_count)
        return any(k is not None for k in keys)


class TelemetryConfig(StrictModel):
    source: Literal["auto", "nvml", "amdsmi", "simulated", "none"] = "auto"  # none: no GPUs
    simulated_path: str = "/_gpu"  # on the engine (the fake engine serves it)
    interval_s: float = Field(default=0.2, gt=0, le=5)  # engine /metrics and GPU samples
    health_interval_s: float = Field(default=1.0, gt=0)  # engine /health probes
    hot_temperature_c: float = Field(default=87.0, gt=0)
    warning_hold_s: float = Field(default=10.0, ge=0)
    # the NVML / amdsmi indexes of this engine's GPUs, where engines share a host (two TP4
    # engines on 8 GPUs: [0,1,2,3] and [4,5,6,7]); None: every GPU of the host
    gpu_indices: list[Annotated[int, Field(ge=0, le=1023)]] | None = Field(
        default=None, min_length=1, max_length=1024
    )

    @field_validator("gpu_indices")
    @classmethod
    def _unique(cls, indices: list[int] | None) -> list[int] | None:
        if indices is not None and len(set(indices)) != len(indices):
            twice = sorted({i for i in indices if indices.count(i) > 1})
            raise ValueError(f"GPU index {', '.join(map(str, twice))} given more than once")
        return indices


class ConsulConfig(StrictModel):
    enabled: bool = True  # false: no registration (routers list the engine statically)
    address: str = "http://127.0.0.1:8500"  # the local Consul agent
    token: str | None = None
    token_file: str | None = None
    token_env: str | None = None
    check_secret_forms = secret_forms("token")
    service: str = "gpuroute-engine"
    ttl_s: float = Field(default=15.0, ge=2)
    deregister_critical_after_s: float = Field(default=600.0, ge=60)  # Consul's minimum: 1m
    timeout_s: float = Field(default=3.0, gt=0)


class ListenConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)
    # load_stream only: with client_ca_file, only routers holding a certificate it signed
    # may watch this host's load
    tls: TlsConfig | None = None


class LoadStreamConfig(ListenConfig):
    """The gRPC load stream. With `token`, only routers holding the same token (their
    `membership.load_stream_token`) may watch, and each report proves it comes from this
    agent (gpuroute/load_auth.py)."""

    token: str | None = None
    token_file: str | None = None
    token_env: str | None = None
    check_secret_forms = secret_forms("token")

    @model_validator(mode="after")
    def _off_loopback_needs_a_token_or_client_certificates(self) -> LoadStreamConfig:
        tokens = (self.token, self.token_file, self.token_env)
        mutual = self.tls is not None and self.tls.client_ca_file is not None
        if not is_loopback(self.host) and all(t is None for t in tokens) and not mutual:
            raise ValueError(
                f"host {self.host!r} is not loopback: set token (or token_file, token_env; "
                "the routers' membership.load_stream_token) or tls.client_ca_file, so only "
                "routers may watch and routers can tell this agent's reports from a forger's"
            )
        return self


class AgentConfig(AdminToken, DeclaresGpuTypes):
    id: Annotated[str, AfterValidator(_service_id)] | None = None  # default: hostname-port
    region: str = "local"
    zone: str = "local-a"
    advertise_address: str = "127.0.0.1"  # where routers reach the engine and load stream
    engine: EngineConfig
    telemetry: TelemetryConfig = TelemetryConfig()
    consul: ConsulConfig = ConsulConfig()
    load_stream: LoadStreamConfig = LoadStreamConfig(port=7070)
    admin: ListenConfig = ListenConfig(port=7071)
    heartbeat_s: float = Field(default=0.25, gt=0, le=5)
    drain_timeout_s: float = Field(default=60.0, ge=0)
    drain_grace_s: float = Field(default=1.0, ge=0)  # routers see the drain within this
    # start as a warm standby: registered (Meta standby = "true"), model loaded, out of the
    # routers' rotation until a router brings it in or `gpuroute agent activate`
    standby: bool = False
    # the admin token (AdminToken's keys) guards POST /drain, /undrain, /standby and
    # /activate. Without one, the admin answers only callers on loopback, and its listener
    # may not leave loopback.

    @model_validator(mode="after")
    def _admin_off_loopback_needs_a_token(self) -> AgentConfig:
        token_off_loopback(self.admin.host, self, "admin", " to protect drain and undrain")
        return self

    @model_validator(mode="after")
    def _meta_fits(self) -> AgentConfig:
        if len(",".join(self.engine.models or ())) > META_VALUE_MAX:
            raise ValueError("engine.models joined by commas must fit Consul's 512-char Meta")
        return self

    @property
    def service_id(self) -> str:
        return self.id or f"{socket.gethostname()}-{self.engine.port}"


def load_agent_config(path: Path | str) -> AgentConfig:
    return load_toml_model(path, AgentConfig)
