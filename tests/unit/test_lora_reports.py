"""LoRA adapters from a vLLM engine's /metrics to the router's Backend: the agent parses
`vllm:lora_requests_info`, streams the adapters with its load report, and the router's
membership sets them on the backend that adapter affinity reads."""

from __future__ import annotations

from gpuroute.agent.engine_metrics import parse_engine_metrics
from gpuroute.agent.load_stream import LoadBroadcaster, LoadSample
from gpuroute.router.backends.membership import Membership
from gpuroute.router.config.router import MembershipConfig
from gpuroute.router.core import Backend, BackendSet, Scheduler
from gpuroute.router.core.policies import build_policy
from gpuroute.router.observe.metrics import RouterMetrics

from gpuroute.proto import load_pb2

# As vLLM v1 writes it (0.8-0.11): the gauge is set to the wall-clock time every step with
# that step's lists as labels, so an older label set may linger beside the current one.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",\
waiting_lora_adapters=""} 1.7614e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,finance",\
waiting_lora_adapters="support"} 1.7615028988e+09
"""


def test_the_latest_lora_requests_info_gives_the_adapters_and_slots() -> None:
    load = parse_engine_metrics(VLLM_METRICS, "vllm")
    assert (load.running, load.waiting, load.kv_cache_usage) == (3, 1, 0.25)
    assert load.lora_adapters == {"sql-lora", "finance", "support"}
    assert load.max_loras == 4


def test_empty_lists_spaces_and_no_gauge() -> None:
    text = (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="8",running_lora_adapters="a, b",'
        'waiting_lora_adapters=""} 1.7e+09\n'
    )
    assert parse_engine_metrics(text, "vllm").lora_adapters == {"a", "b"}
    idle = text.replace('"a, b"', '""')
    assert parse_engine_metrics(idle, "vllm").lora_adapters == frozenset()
    no_lora = parse_engine_metrics("vllm:num_requests_running 2\n", "vllm")
    assert no_lora.lora_adapters is None and no_lora.max_loras is None


def membership(backends: BackendSet) -> Membership:
    scheduler = Scheduler(backends, build_policy("default"))
    return Membership(
        MembershipConfig(),
        scheduler,
        RouterMetrics(),
        known_gpus=("H100",),
        capacity_of=lambda _m: 1.0,
        on_join=lambda _b, _m: None,
        on_remove=lambda _i: None,
        on_health=lambda _e: None,
        clock=lambda: 100.0,
    )


def report(sample: LoadSample, taken_at: float) -> load_pb2.LoadReport:
    """The agent's report for `sample`, as it crosses the wire."""
    broadcaster = LoadBroadcaster("gpu-0", clock=lambda: taken_at)
    broadcaster.sample, broadcaster.taken_at, broadcaster.seq = sample, taken_at, 1
    return load_pb2.LoadReport.FromString(broadcaster.report().SerializeToString())


def test_the_routers_backend_sees_the_adapters_the_agent_reports() -> None:
    backend = Backend("gpu-0", "H100", ("meta-llama/Llama-3.1-8B-Instruct",))
    router = membership(BackendSet([backend]))
    load = parse_engine_metrics(VLLM_METRICS, "vllm")
    sample = LoadSample(running=3, health="passing", lora_adapters=load.lora_adapters, max_loras=4)
    router.on_report("gpu-0", report(sample, taken_at=1000.0))
    assert backend.adapters == {"sql-lora", "finance", "support"}
    assert backend.adapter_slots == 4
    # an older sample arriving late changes nothing; a newer one replaces the set
    router.on_report("gpu-0", report(LoadSample(health="passing", max_loras=4), 999.0))
    assert backend.adapters == {"sql-lora", "finance", "support"}
    router.on_report("gpu-0", report(LoadSample(health="passing", max_loras=4), 1001.0))
    assert backend.adapters == frozenset() and backend.adapter_slots == 4


def test_a_change_of_adapters_is_news_for_the_stream() -> None:
    before = LoadSample(lora_adapters=frozenset({"a"}), max_loras=2)
    assert not before.same_load(LoadSample(lora_adapters=frozenset({"a", "b"}), max_loras=2))
    assert before.same_load(LoadSample(lora_adapters=frozenset({"a"}), max_loras=2))
