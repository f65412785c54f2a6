"""The fake engine's Prometheus families, under vLLM V1's names and labels (the contract
test in tests/real_engine holds them to a real vLLM's)."""

from __future__ import annotations

from collections.abc import Iterator

from gpuroute.testbed.live_engine import LiveEngine
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuroute.prefix_blocks import BLOCK_TOKENS


def vllm_families(
    engine: LiveEngine, labels: dict[str, str], finished: dict[str, int]
) -> Iterator[Metric]:
    """The vLLM V1 families the agent and the contract test read, from the engine model."""
    model, cache = engine.model, engine.model.prefix_cache
    yield gauge(
        labels, "vllm:num_requests_running", "Requests in the running batch.",
        model.num_running,
    )  # fmt: skip
    yield gauge(
        labels, "vllm:num_requests_waiting", "Requests waiting to be scheduled.",
        model.num_waiting,
    )  # fmt: skip
    yield gauge(labels, "vllm:kv_cache_usage_perc", "KV-cache usage, 0 to 1.", model.kv_usage())
    # vLLM counts prefix-cache queries and hits in tokens; this cache works in blocks
    yield counter(
        labels, "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens.",
        cache.lookups * BLOCK_TOKENS,
    )  # fmt: skip
    yield counter(
        labels, "vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.",
        cache.hits * BLOCK_TOKENS,
    )  # fmt: skip
    # the engine model queues a request rather than overfill its KV cache: none, ever
    yield counter(labels, "vllm:num_preemptions", "Requests preempted (never, here).", 0.0)
    yield counter(
        labels, "vllm:prompt_tokens", "Prefilled prompt tokens.", engine.prompt_tokens_total
    )
    yield counter(
        labels, "vllm:generation_tokens", "Generated tokens.", engine.generation_tokens_total
    )
    success = CounterMetricFamily(
        "vllm:request_success", "Finished requests.", labels=[*labels, "finished_reason"]
    )
    for reason, count in finished.items():
        success.add_metric([*labels.values(), reason], count)
    yield success


def gauge(labels: dict[str, str], name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels))
    g.add_metric(list(labels.values()), value)
    return g


def counter(labels: dict[str, str], name: str, doc: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=list(labels))
    c.add_metric(list(labels.values()), value)
    return c
