"""AMD GPUs through amdsmi, and device names matched through the config's GPU catalog.

No AMD GPU (nor ROCm) is on the machines these tests run on, so amdsmi is a fake module
shaped like its documented Python API (ROCm/amdsmi py-interface/amdsmi_interface.py): the
same function names, argument orders, units (VRAM in MB, temperature in C, power in W) and
"N/A" strings for readings a GPU lacks."""

from __future__ import annotations

import asyncio
import enum
import logging
import sys
import types
from typing import Any

import pytest
from gpuroute.agent.amdsmi_source import AmdSmiSource, open_gpu_source
from gpuroute.agent.config import AgentConfig
from gpuroute.agent.gpu_telemetry import (
    GpuSample,
    GpuUnavailable,
    NoGpuSource,
    declared_type_problems,
)

from gpuroute.gpus import GpuCatalog, GpuSpec

MIB = 1 << 20


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    """amdsmi raises this for AMDSMI_STATUS_NOT_SUPPORTED and friends."""


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


def fake_amdsmi(gpus: list[dict[str, Any]], init_error: str | None = None) -> types.ModuleType:
    """A module with amdsmi's calls over `gpus` (one dict of readings per GPU; a reading
    missing from it raises the library's not-supported exception)."""
    smi = types.ModuleType("amdsmi")
    smi.AmdSmiException = AmdSmiException
    smi.AmdSmiLibraryException = AmdSmiLibraryException
    smi.AmdSmiTemperatureType = AmdSmiTemperatureType
    smi.AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    smi.shut_down = 0

    def reading(key: str):
        def call(handle: int, *args: Any) -> Any:
            value = gpus[handle].get(key)
            if value is None:
                raise AmdSmiLibraryException(f"{key}: AMDSMI_STATUS_NOT_SUPPORTED")
            return value(*args) if callable(value) else value

        call.__name__ = key
        return call

    def init() -> None:
        if init_error:
            raise AmdSmiLibraryException(init_error)

    def shut_down() -> None:
        smi.shut_down += 1

    smi.amdsmi_init = init
    smi.amdsmi_shut_down = shut_down
    smi.amdsmi_get_processor_handles = lambda: list(range(len(gpus)))
    for key in (
        "amdsmi_get_gpu_asic_info", "amdsmi_get_gpu_vram_usage", "amdsmi_get_gpu_activity",
        "amdsmi_get_temp_metric", "amdsmi_get_power_info", "amdsmi_get_violation_status",
        "amdsmi_get_gpu_total_ecc_count", "amdsmi_get_gpu_bad_page_info",
        "amdsmi_get_gpu_process_list",
    ):  # fmt: skip
        setattr(smi, key, reading(key))
    return smi


def mi300x(**overrides: Any) -> dict[str, Any]:
    """An MI300X under load, as amdsmi reports it: no edge sensor (0), hotspot 71 C."""
    temps = {AmdSmiTemperatureType.EDGE: 0, AmdSmiTemperatureType.HOTSPOT: 71}
    return {
        "amdsmi_get_gpu_asic_info": {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002"},
        "amdsmi_get_gpu_vram_usage": {"vram_total": 196592, "vram_used": 180000},
        "amdsmi_get_gpu_activity": {"gfx_activity": 87, "umc_activity": 40, "mm_activity": "N/A"},
        "amdsmi_get_temp_metric": lambda sensor, _metric: temps[sensor],
        "amdsmi_get_power_info": {"current_socket_power": 612, "average_socket_power": 598,
                                  "gfx_voltage": "N/A", "power_limit": 750},
        "amdsmi_get_violation_status": {"active_prochot_thrm": False, "active_ppt_pwr": True,
                                        "active_socket_thrm": False, "active_vr_thrm": "N/A",
                                        "active_hbm_thrm": False},
        "amdsmi_get_gpu_total_ecc_count": {"correctable_count": 3, "uncorrectable_count": 0,
                                           "deferred_count": 0},
        "amdsmi_get_gpu_bad_page_info": [],
        "amdsmi_get_gpu_process_list": [{"pid": 4242}],
    } | overrides  # fmt: skip


def test_amdsmi_reads_an_amd_gpu_as_nvml_reads_an_nvidia_one() -> None:
    hot = mi300x(
        amdsmi_get_power_info={"current_socket_power": "N/A", "average_socket_power": 640},
        amdsmi_get_violation_status={"active_socket_thrm": True, "active_ppt_pwr": True},
        amdsmi_get_gpu_total_ecc_count={"uncorrectable_count": 2},
    )
    smi = fake_amdsmi([mi300x(), hot])
    source = AmdSmiSource("MI300X", module=smi)
    reading = asyncio.run(source.read())  # in a worker thread, as the agent reads it
    assert reading.error is None and source.count == 2
    first, second = reading.gpus
    assert first == GpuSample(
        index=0, name="AMD Instinct MI300X", util=0.87,
        memory_total=196592 * MIB, memory_used=180000 * MIB,
        temperature_c=71.0, power_w=612.0, throttle_reasons=("ppt_power_cap",),
        ecc_uncorrected=0, retired_pages=0, processes=1,
    )  # fmt: skip
    assert not first.throttled  # the power cap under full load is normal operation
    assert second.power_w == 640.0  # average power where the current one is N/A
    assert second.throttle_reasons == ("ppt_power_cap", "socket_thermal_slowdown")
    assert second.throttled and reading.throttled and reading.ecc_uncorrected == 2
    asyncio.run(source.close())
    assert smi.shut_down == 1


def test_readings_a_gpu_lacks_are_unknown_and_said_once(caplog) -> None:
    caplog.set_level(logging.INFO, "gpuroute.agent.gpu")
    bare = mi300x(
        amdsmi_get_gpu_activity={"gfx_activity": "N/A"},
        amdsmi_get_temp_metric=None,
        amdsmi_get_power_info=None,
        amdsmi_get_violation_status=None,  # before ROCm 6.3, or a GPU before MI300
        amdsmi_get_gpu_total_ecc_count=None,
        amdsmi_get_gpu_bad_page_info=None,
        amdsmi_get_gpu_process_list=None,
    )
    source = AmdSmiSource(module=fake_amdsmi([bare]))
    (gpu,) = source.read_sync().gpus
    source.read_sync()
    assert (gpu.util, gpu.temperature_c, gpu.power_w, gpu.throttle_reasons) == (0.0, None, None, ())
    assert (gpu.ecc_uncorrected, gpu.retired_pages, gpu.processes) == (None, None, None)
    said = [r.getMessage() for r in caplog.records if "amdsmi_get_power_info" in r.getMessage()]
    assert said == ["amdsmi: amdsmi_get_power_info: amdsmi_get_power_info: "
                    "AMDSMI_STATUS_NOT_SUPPORTED (reported as unknown)"]  # fmt: skip


def test_a_gpu_that_stops_answering_is_an_error_in_the_reading() -> None:
    lost = mi300x(amdsmi_get_gpu_vram_usage=None)
    reading = AmdSmiSource(module=fake_amdsmi([mi300x(), lost])).read_sync()
    assert len(reading.gpus) == 1 and reading.error.startswith("gpu 1: amdsmi_get_gpu_vram_usage")


def test_amdsmi_missing_says_how_to_install_it_and_auto_falls_back(monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, "gpuroute.agent.gpu")
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # `import amdsmi` fails as if absent
    with pytest.raises(GpuUnavailable, match=r"amdsmi is not importable") as err:
        AmdSmiSource()
    assert "python3 -m pip install /opt/rocm/share/amd_smi" in str(err.value)
    explicit = open_gpu_source("amdsmi", "http://127.0.0.1:9/_gpu")
    assert isinstance(explicit, NoGpuSource) and "amdsmi unavailable" in explicit.reason
    assert "/opt/rocm/share/amd_smi" in explicit.reason
    auto = open_gpu_source("auto", "http://127.0.0.1:9/_gpu")
    if auto.name == "nvml":
        pytest.skip("this machine has a working NVML")
    assert auto.name == "simulated" and "amdsmi unavailable" in caplog.text


def test_auto_takes_amdsmi_when_nvml_cannot_run(monkeypatch) -> None:
    from gpuroute.agent import gpu_telemetry

    def no_nvml(*_args: Any) -> None:
        raise GpuUnavailable("libnvidia-ml.so not found (no NVIDIA driver)")

    monkeypatch.setattr(gpu_telemetry, "NvmlSource", no_nvml)
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([mi300x()]))
    source = open_gpu_source("auto", "http://127.0.0.1:9/_gpu", "MI300X")
    assert isinstance(source, AmdSmiSource) and source.count == 1
    failing = fake_amdsmi([], init_error="AMDSMI_STATUS_DRIVER_NOT_LOADED")
    monkeypatch.setitem(sys.modules, "amdsmi", failing)
    explicit = open_gpu_source("amdsmi", "http://127.0.0.1:9/_gpu")
    assert isinstance(explicit, NoGpuSource)
    assert explicit.reason == (
        "amdsmi unavailable: amdsmi init failed: AMDSMI_STATUS_DRIVER_NOT_LOADED"
    )


def test_a_declared_types_device_names_match_what_the_driver_reports(caplog) -> None:
    """A GPU no built-in knows is declared with the name its driver reports; the agent's
    check then agrees, where the built-in mapping alone says how to declare it."""
    data = {
        "engine": {"gpu": "MI355X"},
        "gpu_types": [{"name": "MI355X", "memory_gb": 288, "memory_bandwidth_tbs": 8,
                       "fp16_tflops": 2500, "device_names": ["AMD Instinct MI355X"]}],
    }  # fmt: skip
    catalog = AgentConfig.model_validate(data, context=AgentConfig.validation_context(data))
    catalog = catalog.gpu_catalog()
    gpu = GpuSample(0, "AMD Instinct MI355X", 0.0, 288 << 30, 0)
    assert declared_type_problems([gpu], "MI355X", catalog) == []
    (unknown,) = declared_type_problems([gpu], "MI355X")  # the built-ins alone
    assert "declare it in the agent's config under [[gpu_types]]" in unknown
    assert "device_names = [that name]" in unknown
    caplog.set_level(logging.WARNING, "gpuroute.agent.gpu")
    mi355 = mi300x(amdsmi_get_gpu_asic_info={"market_name": "AMD Instinct MI355X"})
    AmdSmiSource("MI355X", catalog, module=fake_amdsmi([mi355])).read_sync()
    assert "GPU type" not in caplog.text
    AmdSmiSource("MI300X", catalog, module=fake_amdsmi([mi355])).read_sync()
    assert "gpu 0 is 'AMD Instinct MI355X' (MI355X) but engine.gpu says MI300X" in caplog.text


def test_a_declared_name_overrides_the_built_in_mapping() -> None:
    """A variant the built-in mapping would file under its family, declared as its own."""
    spec = GpuSpec("H100NVL94", 94, 3.9, 835, 400, device_names=("NVIDIA H100 NVL",))
    catalog = GpuCatalog([spec])
    assert catalog.type_of_device("NVIDIA H100 NVL") == "H100NVL94"
    gpu = GpuSample(0, "NVIDIA H100 NVL", 0.0, 94 << 30, 0)
    assert declared_type_problems([gpu], "H100NVL94", catalog) == []
    (problem,) = declared_type_problems([gpu], "H100NVL94")
    assert "(H100) but engine.gpu says H100NVL94" in problem


def test_an_agent_reports_only_its_engines_gpus(monkeypatch) -> None:
    """Two TP4 engines on an 8-GPU host: the agent of the second reads GPUs 4 to 7 alone
    (telemetry.gpu_indices), under their host-wide indexes."""
    hosts = [mi300x(amdsmi_get_gpu_activity={"gfx_activity": 10 * i}) for i in range(8)]
    source = AmdSmiSource("MI300X", None, [4, 5, 6, 7], module=fake_amdsmi(hosts))
    reading = source.read_sync()
    assert [g.index for g in reading.gpus] == [4, 5, 6, 7] and reading.error is None
    assert [g.util for g in reading.gpus] == [0.4, 0.5, 0.6, 0.7]
    assert [g.index for g in AmdSmiSource(module=fake_amdsmi(hosts)).read_sync().gpus] == [
        *range(8)
    ]  # no gpu_indices: every GPU of the host
    with pytest.raises(GpuUnavailable, match=r"telemetry.gpu_indices \[8\]: amdsmi sees 8 GPU"):
        AmdSmiSource(indices=[6, 7, 8], module=fake_amdsmi(hosts))
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(hosts))
    explicit = open_gpu_source("amdsmi", "http://127.0.0.1:9/_gpu", indices=[9])
    assert isinstance(explicit, NoGpuSource) and "telemetry.gpu_indices [9]" in explicit.reason


@pytest.mark.parametrize(
    ("indices", "said"),
    [
        ("[4, 5, 4]", "GPU index 4 given more than once"),
        ("[-1]", "telemetry.gpu_indices[0]: must be >= 0"),
        ("[]", "at least 1 item"),
    ],
)
def test_gpu_indices_are_checked_naming_the_key(tmp_path, indices, said) -> None:
    from gpuroute.agent.config import load_agent_config

    from gpuroute.config import ConfigError

    path = tmp_path / "agent.toml"
    path.write_text(f'[engine]\ngpu = "H100"\n[telemetry]\ngpu_indices = {indices}\n')
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert f"{path}: telemetry.gpu_indices" in str(err.value) and said in str(err.value)
    path.write_text('[engine]\ngpu = "H100"\n[telemetry]\ngpu_indices = [4, 5, 6, 7]\n')
    assert load_agent_config(path).telemetry.gpu_indices == [4, 5, 6, 7]
    path.write_text('[engine]\ngpu = "H100"\n')
    assert load_agent_config(path).telemetry.gpu_indices is None
