"""The agent's pure parts: health transitions, degraded reasons, metric-name mapping, GPU
telemetry helpers, the Consul service definition."""

from __future__ import annotations

import logging

import pytest
from gpuroute.agent.amdsmi_source import open_gpu_source
from gpuroute.agent.config import AgentConfig, load_agent_config
from gpuroute.agent.core.health import (
    CONSUL_STATUS,
    TRANSITIONS,
    Health,
    HealthSettings,
    HostHealth,
    Signal,
    degraded_reason,
)
from gpuroute.agent.engine_metrics import EngineLoad, parse_engine_metrics
from gpuroute.agent.gpu_telemetry import (
    NoGpuSource,
    SimulatedSource,
    throttle_names,
)
from gpuroute.agent.registration import check_id, service_definition

from gpuroute.config import ConfigError
from gpuroute.consul_client import check_meta

SETTINGS = HealthSettings(down_after=2, up_after=2, warning_hold_s=10.0)


def states(health: HostHealth, samples) -> list[str]:
    out = []
    for now, ok, degraded in samples:
        health.observe(now, ok, degraded)
        out.append(health.state.value)
    return out


def test_warming_until_the_engine_answers_then_passing() -> None:
    h = HostHealth(SETTINGS)
    assert states(h, [(0, False, None), (1, False, None), (2, False, None), (3, True, None)]) == [
        "warming", "warming", "warming", "passing",
    ]  # fmt: skip
    assert h.consul_status == "passing"


def test_critical_needs_consecutive_failures_and_recovery_consecutive_successes() -> None:
    h = HostHealth(SETTINGS)
    samples = [(0, True, None), (1, False, None), (2, True, None), (3, False, None),
               (4, False, None), (5, True, None), (6, True, None)]  # fmt: skip
    assert states(h, samples) == [
        "passing", "passing", "passing", "passing", "critical", "critical", "passing",
    ]  # fmt: skip


def test_warning_is_held_after_the_last_degraded_sample() -> None:
    h = HostHealth(SETTINGS)
    hot = "GPU clocks throttled (hw_thermal_slowdown)"
    samples = [(0, True, None), (1, True, hot), (5, True, None), (10.9, True, None),
               (11.1, True, None)]  # fmt: skip
    assert states(h, samples) == ["passing", "warning", "warning", "warning", "passing"]
    assert h.consul_output == "passing: engine healthy"


def test_draining_holds_until_undrain() -> None:
    h = HostHealth(SETTINGS)
    h.observe(0, True)
    assert h.drain().new is Health.DRAINING
    assert h.drain() is None
    assert states(h, [(1, False, None), (2, False, None), (3, True, None)]) == ["draining"] * 3
    assert h.consul_status == "critical"
    assert h.undrain().new is Health.WARMING
    assert h.undrain() is None
    assert states(h, [(4, True, None)]) == ["passing"]


def test_transition_table_covers_drain_from_every_state_and_only_undrain_leaves_it() -> None:
    for state in Health:
        if state is not Health.DRAINING:
            assert TRANSITIONS[(state, Signal.DRAIN)] is Health.DRAINING
    leaving = {k: v for k, v in TRANSITIONS.items() if k[0] is Health.DRAINING}
    assert leaving == {(Health.DRAINING, Signal.UNDRAIN): Health.WARMING}
    assert set(CONSUL_STATUS) == set(Health)
    assert {CONSUL_STATUS[Health.WARMING], CONSUL_STATUS[Health.CRITICAL]} == {"critical"}


def test_flapping_engine_makes_few_transitions() -> None:
    h = HostHealth(SETTINGS)
    transitions = 0
    for i in range(200):  # up, down, up, down: never two failures in a row
        transitions += h.observe(float(i), i % 2 == 0) is not None
    assert transitions == 1  # warming -> passing only


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((True, ("hw_thermal_slowdown",), 70.0, 0, None), "GPU clocks throttled"),
        ((False, (), 90.0, 0, None), "temperature at or above 87"),
        ((False, (), 60.0, 2, None), "uncorrected ECC"),
        ((False, (), None, 0, "nvml: GPU is lost"), "telemetry failing"),
        ((False, ("sw_power_cap",), 60.0, 0, None), None),
    ],
)
def test_degraded_reason(args, expected) -> None:
    reason = degraded_reason(*args, SETTINGS)
    assert (reason is None) if expected is None else (expected in reason)


VLLM_TEXT = """\
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="a"} 0.9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="a"} 256.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="a"} 1000.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="a"} 2.0
"""


def test_vllm_metrics_sum_over_models_and_prefer_the_v1_kv_name() -> None:
    assert parse_engine_metrics(VLLM_TEXT, "vllm") == EngineLoad(5, 4, 0.25, 256.0, 1000.0, 2.0)


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        ("sglang", "sglang:num_running_reqs 7\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n",
         EngineLoad(7, 1, 0.5)),
        ("tgi", "tgi_batch_current_size 12\ntgi_queue_size 3\n", EngineLoad(12, 3, None)),
        ("triton", 'nv_inference_pending_request_count{model="m",version="1"} 9\n',
         EngineLoad(None, 9, None)),
        ("vllm", "other_metric 1\n", EngineLoad(None, None, None)),
    ],
)  # fmt: skip
def test_each_engine_kind_maps_its_names(kind, text, expected) -> None:
    assert parse_engine_metrics(text, kind) == expected


def test_fake_engine_exports_every_vllm_name_the_agent_reads(tmp_path) -> None:
    from gpuroute.testbed.fake_engine.server import FakeEngine, FakeEngineConfig
    from prometheus_client import generate_latest

    engine = FakeEngine(FakeEngineConfig())
    import asyncio

    asyncio.run(engine._start(None))
    text = generate_latest(engine.registry).decode()
    load = parse_engine_metrics(text, "vllm")
    # None would mean a name the agent reads is missing
    assert load == EngineLoad(0, 0, 0.0, 0.0, 0.0, 0.0)


def test_throttle_reason_bits_are_named() -> None:
    assert throttle_names(0x01 | 0x40) == ("gpu_idle", "hw_thermal_slowdown")
    assert throttle_names(0) == ()


def test_nvml_unavailable_falls_back_with_a_clear_log_line(caplog) -> None:
    caplog.set_level(logging.INFO, "gpuroute.agent.gpu")
    auto = open_gpu_source("auto", "http://127.0.0.1:9/_gpu")
    explicit = open_gpu_source("nvml", "http://127.0.0.1:9/_gpu")
    try:
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("this machine has a working NVML")
    except Exception:
        pass
    assert isinstance(auto, SimulatedSource)
    assert isinstance(explicit, NoGpuSource) and "NVML unavailable" in explicit.reason
    assert "using the simulated GPU" in caplog.text
    assert "running without GPU data" in caplog.text


def test_simulated_source_reports_an_unreachable_engine_as_an_error() -> None:
    import asyncio

    async def read():
        source = SimulatedSource("http://127.0.0.1:9/_gpu", timeout_s=0.5)
        try:
            return await source.read()
        finally:
            await source.close()

    reading = asyncio.run(read())
    assert reading.gpus == () and "127.0.0.1:9" in reading.error


def agent_config(**engine) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "id": "h1",
            "region": "eu-west",
            "zone": "eu-west-1a",
            "engine": {"models": ["m1", "m2"], "gpu": "A100", "url": "http://10.0.0.5:8001"}
            | engine,
        }
    )


def test_service_definition_carries_meta_and_a_ttl_check() -> None:
    config = agent_config(capacity=0.5, gpu_count=2)
    definition = service_definition(config, 7070, "critical")
    assert definition["ID"] == "h1" and definition["Port"] == 8001
    assert definition["Meta"] == {
        "region": "eu-west", "zone": "eu-west-1a", "gpu_model": "A100", "gpu_count": "2",
        "tensor_parallel": "2", "pipeline_parallel": "1", "data_parallel": "1",
        "gpu_memory_gb": "80", "models": "m1,m2", "engine_kind": "vllm", "load_port": "7070",
        "agent_version": "1", "capacity": "0.5", "scheme": "http",
    }  # fmt: skip
    check = definition["Check"]
    assert check["CheckID"] == check_id(config) == "gpuroute-agent:h1"
    assert check["TTL"] == "15s" and check["Status"] == "critical"
    assert check["DeregisterCriticalServiceAfter"] == "600s"
    standing_by = service_definition(config, 7070, "passing", standby=True)["Meta"]
    assert standing_by == definition["Meta"] | {"standby": "true"}  # and only while it is


def test_meta_limits_are_checked_before_consul_sees_them() -> None:
    with pytest.raises(ValueError, match="512"):
        check_meta({"models": "x" * 513})
    with pytest.raises(ValueError, match="not allowed"):
        check_meta({"consul-version": "1"})
    with pytest.raises(ValueError, match="64"):
        check_meta({f"k{i}": "v" for i in range(65)})


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ('[engine]\nmodels = ["m"]\ngpu = "B300"\n', "engine.gpu", "unknown GPU type"),
        ('[engine]\nmodels = ["m"]\ngpu = "H100"\nkind = "ollama"\n', "engine.kind", "vllm"),
        ('[engine]\nmodels = ["m"]\ngpu = "H100"\nurl = "localhost"\n', "engine.url", "http"),
        ('id = "a b"\n[engine]\nmodels = ["m"]\ngpu = "H100"\n', "id", "letters"),
        ('[engine]\nmodels = ["m"]\ngpu = "H100"\n[consul]\nttl_s = 1\n', "consul.ttl_s", "2"),
        ('[engine]\nmodels = ["m"]\ngpu = "H100"\n[telemetry]\nsource = "x"\n',
         "telemetry.source", "'auto'"),
    ],
)  # fmt: skip
def test_bad_agent_config_names_file_and_key(tmp_path, text, key, message) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert str(path) in str(err.value) and key in str(err.value) and message in str(err.value)


def test_agent_cli_exits_2_on_bad_config(tmp_path, capsys) -> None:
    from gpuroute.cli import main

    path = tmp_path / "agent.toml"
    path.write_text("[engine]\n")
    assert main(["agent", "--config", str(path)]) == 2
    assert f"{path}: engine.gpu: missing (required)" in capsys.readouterr().err


def test_example_agent_config_is_valid(repo) -> None:
    config = load_agent_config(repo / "agent.example.toml")
    assert config.consul.enabled and config.telemetry.source == "auto"
