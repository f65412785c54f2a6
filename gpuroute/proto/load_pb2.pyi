from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class WatchLoadRequest(_message.Message):
    __slots__ = ("router_id", "nonce", "sent_at", "router_proof")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    ROUTER_PROOF_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    nonce: bytes
    sent_at: float
    router_proof: bytes
    def __init__(self, router_id: _Optional[str] = ..., nonce: _Optional[bytes] = ..., sent_at: _Optional[float] = ..., router_proof: _Optional[bytes] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("backend_id", "seq", "timestamp", "running", "waiting", "kv_cache_usage", "gpu_util", "memory_free_bytes", "throttled", "health", "prefix_cache_hits", "prefix_cache_queries", "preemptions", "lora_adapters", "max_loras", "proof")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_UTIL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    seq: int
    timestamp: float
    running: int
    waiting: int
    kv_cache_usage: float
    gpu_util: float
    memory_free_bytes: int
    throttled: bool
    health: str
    prefix_cache_hits: float
    prefix_cache_queries: float
    preemptions: float
    lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    max_loras: int
    proof: bytes
    def __init__(self, backend_id: _Optional[str] = ..., seq: _Optional[int] = ..., timestamp: _Optional[float] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., gpu_util: _Optional[float] = ..., memory_free_bytes: _Optional[int] = ..., throttled: _Optional[bool] = ..., health: _Optional[str] = ..., prefix_cache_hits: _Optional[float] = ..., prefix_cache_queries: _Optional[float] = ..., preemptions: _Optional[float] = ..., lora_adapters: _Optional[_Iterable[str]] = ..., max_loras: _Optional[int] = ..., proof: _Optional[bytes] = ...) -> None: ...

class WatchRegionRequest(_message.Message):
    __slots__ = ("global_id",)
    GLOBAL_ID_FIELD_NUMBER: _ClassVar[int]
    global_id: str
    def __init__(self, global_id: _Optional[str] = ...) -> None: ...

class RegionReport(_message.Message):
    __slots__ = ("region", "seq", "timestamp", "utilisation", "queue_delay_s", "queue_depth", "routable_backends", "capacity", "models", "ttft_p99_s", "e2e_p99_s", "known_models")
    REGION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ROUTABLE_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_S_FIELD_NUMBER: _ClassVar[int]
    E2E_P99_S_FIELD_NUMBER: _ClassVar[int]
    KNOWN_MODELS_FIELD_NUMBER: _ClassVar[int]
    region: str
    seq: int
    timestamp: float
    utilisation: float
    queue_delay_s: float
    queue_depth: int
    routable_backends: int
    capacity: float
    models: _containers.RepeatedScalarFieldContainer[str]
    ttft_p99_s: float
    e2e_p99_s: float
    known_models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, region: _Optional[str] = ..., seq: _Optional[int] = ..., timestamp: _Optional[float] = ..., utilisation: _Optional[float] = ..., queue_delay_s: _Optional[float] = ..., queue_depth: _Optional[int] = ..., routable_backends: _Optional[int] = ..., capacity: _Optional[float] = ..., models: _Optional[_Iterable[str]] = ..., ttft_p99_s: _Optional[float] = ..., e2e_p99_s: _Optional[float] = ..., known_models: _Optional[_Iterable[str]] = ...) -> None: ...
