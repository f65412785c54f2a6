"""The names NVML (nvmlDeviceGetName, what `nvidia-smi -L` prints) and amdsmi give real
devices map to GPU types; an unknown one gets an error that says how to declare it.

Where each string is seen: NVIDIA's data-center GPU and DCGM documentation and the clouds'
instance documentation (AWS EC2 accelerated instances, Google Cloud GPU platforms, Azure
ND/NC series), which print `nvidia-smi` output; AMD's ROCm/amdsmi documentation for the
Instinct names."""

from __future__ import annotations

import pytest
from gpuroute.router.backends.priors import engine_priors

from gpuroute.gpus import GPU_SPECS, UnknownGpuName, gpu_type_of_device

REAL_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100",  # SXM5 (AWS p5, GCP a3)
    "NVIDIA H100 PCIe": "H100",
    "NVIDIA H100 NVL": "H100",
    "NVIDIA H200": "H200",  # AWS p5e, GCP a3-ultra
    "NVIDIA H200 NVL": "H200",
    "NVIDIA H20": "H20",
    "NVIDIA B200": "B200",  # AWS p6-b200, GCP a4
    "NVIDIA GB200": "GB200",
    "NVIDIA A100-SXM4-40GB": "A100",  # AWS p4d, GCP a2
    "NVIDIA A100-SXM4-80GB": "A100",  # AWS p4de, GCP a2-ultra
    "NVIDIA A100-PCIE-40GB": "A100",
    "NVIDIA A100 80GB PCIe": "A100",
    "NVIDIA A10G": "A10G",  # AWS g5
    "NVIDIA A10": "A10",  # Azure NVadsA10 v5
    "NVIDIA L4": "L4",  # GCP g2, AWS g6
    "NVIDIA L40S": "L40S",  # AWS g6e
    "NVIDIA L40": "L40",
    "NVIDIA RTX 6000 Ada Generation": "RTX6000Ada",
    "Tesla T4": "T4",  # AWS g4dn, GCP n1 + T4
    "Tesla V100-SXM2-16GB": "V100",  # AWS p3
    "Tesla V100-SXM2-32GB": "V100",  # AWS p3dn
    "Tesla V100-PCIE-32GB": "V100",
    "Tesla V100S-PCIE-32GB": "V100",
    "AMD Instinct MI300X": "MI300X",  # amdsmi, Azure ND MI300X v5
    "AMD Instinct MI325X": "MI325X",
}


@pytest.mark.parametrize(("device", "gpu_type"), sorted(REAL_NAMES.items()))
def test_each_real_device_name_maps_to_its_type(device: str, gpu_type: str) -> None:
    assert gpu_type_of_device(device) == gpu_type


def test_a_type_that_contains_another_is_not_taken_for_it() -> None:
    """H20 is a prefix of H200, A10 of A100 and A10G, L40 of L40S."""
    assert [gpu_type_of_device(f"NVIDIA {n}") for n in ("H20", "H200", "A10", "A100")] == [
        "H20",
        "H200",
        "A10",
        "A100",
    ]


@pytest.mark.parametrize("device", ["NVIDIA GeForce RTX 4090", "Quadro RTX 8000", "", "  "])
def test_an_unknown_device_says_how_to_declare_it(device: str) -> None:
    with pytest.raises(UnknownGpuName) as caught:
        gpu_type_of_device(device)
    message = str(caught.value)
    assert repr(device) in message and "[[gpu_types]]" in message and "device_names" in message
    assert "H100" in message and "MI300X" in message


def test_every_type_prices_an_8b_model_in_the_order_of_its_data_sheet() -> None:
    """Decode follows memory bandwidth, prefill dense FLOPS: the H200 decodes faster than
    the H100 at the same FLOPS, the B200 faster again; the L40S prefills faster than the
    A10 and the MI300X than the H100."""
    priors = engine_priors("llama-3.1-8b")
    assert set(priors) == set(GPU_SPECS)
    decode = {gpu: p.cost.decode_s_per_token for gpu, p in priors.items()}
    prefill = {gpu: p.cost.prefill_s_per_token for gpu, p in priors.items()}
    assert decode["B200"] < decode["H200"] < decode["H100"]
    assert prefill["H200"] == pytest.approx(prefill["H100"], rel=0.05)  # same FLOPS
    assert prefill["L40S"] < prefill["A10"] and prefill["MI300X"] < prefill["H100"]


def test_the_agent_says_when_nvml_disagrees_with_the_declared_type() -> None:
    """The declared type is used (the operator may know better), but a mismatch or an
    unknown device is logged with what NVML reported."""
    from gpuroute.agent.gpu_telemetry import GpuSample, declared_type_problems

    def sample(index: int, name: str) -> GpuSample:
        return GpuSample(index, name, 0.0, 80 << 30, 0)

    agreeing = [sample(0, "NVIDIA H100 80GB HBM3"), sample(1, "NVIDIA H100 80GB HBM3")]
    assert declared_type_problems(agreeing, "H100") == []
    (mismatch,) = declared_type_problems([sample(0, "NVIDIA H200")], "H100")
    assert mismatch == (
        "gpu 0 is 'NVIDIA H200' (H200) but engine.gpu says H100; the router prices it as H100"
    )
    (unknown,) = declared_type_problems([sample(3, "NVIDIA GeForce RTX 4090")], "H100")
    assert unknown.startswith("gpu 3: GPU 'NVIDIA GeForce RTX 4090' is none of the known types")
