from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class WatchLoadRequest(_message.Message):
    __slots__ = ("router_id",)
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    def __init__(self, router_id: _Optional[str] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("backend_id", "seq", "timestamp", "running", "waiting", "kv_cache_usage", "gpu_util", "memory_free_bytes", "throttled", "health")
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
    def __init__(self, backend_id: _Optional[str] = ..., seq: _Optional[int] = ..., timestamp: _Optional[float] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., gpu_util: _Optional[float] = ..., memory_free_bytes: _Optional[int] = ..., throttled: _Optional[bool] = ..., health: _Optional[str] = ...) -> None: ...
