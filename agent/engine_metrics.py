"""The engine's own view of its load, read from its Prometheus `/metrics` page.

Each engine names the same facts differently; one table maps them to three fields. Where an
engine has no gauge for a field it stays None and the router falls back on its own ledger.

- running: vllm:num_requests_running; sglang:num_running_reqs; tgi_batch_current_size;
  Triton has none.
- waiting: vllm:num_requests_waiting; sglang:num_queue_reqs; tgi_queue_size;
  Triton nv_inference_pending_request_count.
- kv_cache_usage (0..1): vllm:kv_cache_usage_perc (v1) or vllm:gpu_cache_usage_perc (v0);
  sglang:token_usage; TGI and Triton have none.
- prefix_cache_hits / prefix_cache_queries (counters, in tokens): vllm's
  prefix_cache_{hits,queries}_total; the others export none (SGLang only a hit-rate gauge).
- preemptions (counter): vllm:num_preemptions_total; the others have none.
- LoRA adapters: vllm:lora_requests_info, a gauge whose labels carry the lists
  (`running_lora_adapters="a,b"`, `waiting_lora_adapters="c"`, `max_lora="4"`) and whose
  value is the wall-clock time it was set; vLLM sets it every step, so a page may hold
  several label sets and the latest (the largest value) is the engine's state now.

Triton running the vLLM backend also exports the vllm: names; use `kind = "vllm"` there."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

LORA_INFO = "vllm:lora_requests_info"

ENGINE_METRIC_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
        "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
        "preemptions": ("vllm:num_preemptions_total",),
    },
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_cache_usage": ("sglang:token_usage",),
    },
    "tgi": {
        "running": ("tgi_batch_current_size",),
        "waiting": ("tgi_queue_size",),
        "kv_cache_usage": (),
    },
    "triton": {
        "running": (),
        "waiting": ("nv_inference_pending_request_count",),
        "kv_cache_usage": (),
    },
}
ENGINE_KINDS = tuple(ENGINE_METRIC_NAMES)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None
    # counters since the engine started (they restart with it)
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None
    preemptions: float | None = None
    # LoRA adapters running or waiting in the engine, and its adapter slots (vLLM only)
    lora_adapters: frozenset[str] | None = None
    max_loras: int | None = None

    @property
    def in_flight(self) -> int:
        return (self.running or 0) + (self.waiting or 0)


def parse_engine_metrics(text: str, kind: str) -> EngineLoad:
    """Sum each field over its samples (one per model or GPU); unknown names are ignored."""
    names = ENGINE_METRIC_NAMES[kind]
    wanted = {name: fld for fld, candidates in names.items() for name in candidates}
    totals: dict[str, float] = {}
    found: dict[str, str] = {}  # field -> the first metric name that supplied it
    lora: Sample | None = None  # the latest vllm:lora_requests_info
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LORA_INFO and (lora is None or sample.value > lora.value):
                lora = sample
                continue
            fld = wanted.get(sample.name)
            if fld is None or found.setdefault(fld, sample.name) != sample.name:
                continue
            totals[fld] = totals.get(fld, 0.0) + sample.value
    kv = totals.get("kv_cache_usage")
    return EngineLoad(
        running=int(totals["running"]) if "running" in totals else None,
        waiting=int(totals["waiting"]) if "waiting" in totals else None,
        kv_cache_usage=min(1.0, max(0.0, kv)) if kv is not None else None,
        prefix_cache_hits=totals.get("prefix_cache_hits"),
        prefix_cache_queries=totals.get("prefix_cache_queries"),
        preemptions=totals.get("preemptions"),
        **(lora_info(lora.labels) if lora is not None and kind == "vllm" else {}),
    )


def lora_info(labels: dict[str, str]) -> dict[str, object]:
    """The adapters running or waiting (either list may be empty) and the slot count."""
    named = labels.get("running_lora_adapters", "") + "," + labels.get("waiting_lora_adapters", "")
    adapters = frozenset(a.strip() for a in named.split(",") if a.strip())
    try:
        slots: int | None = int(labels.get("max_lora", ""))
    except ValueError:
        slots = None
    return {"lora_adapters": adapters, "max_loras": slots}
