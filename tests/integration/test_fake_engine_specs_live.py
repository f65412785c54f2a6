"""`gpuroute fake-engine` as a process on a GPU type a scenario declares, spanning four of
them, running a 70B shape: what it says it serves, and that it serves it."""

from __future__ import annotations

import json
import urllib.request

from support.live import FakeEngineProcess, get_json
from support.paths import REPO

REAL_FLEET = REPO / "sim" / "scenarios" / "real-fleet.toml"
MODEL = "llama-3.1-70b"


def test_a_declared_gpu_at_tensor_parallel_4_serves_a_70b() -> None:
    engine = FakeEngineProcess(
        "A800",
        extra=("--tensor-parallel", "4", "--model", MODEL, "--specs", str(REAL_FLEET)),
    )
    try:
        (served,) = get_json(engine.url + "/v1/models")["data"]
        assert (served["id"], served["max_model_len"]) == (MODEL, 131072)
        parallel = get_json(engine.url + "/server_info")["vllm_config"]["parallel_config"]
        assert parallel["tensor_parallel_size"] == 4
        gpus = get_json(engine.url + "/_gpu")["gpus"]
        assert [g["name"] for g in gpus] == ["NVIDIA A800 (simulated)"] * 4
        body = {"model": MODEL, "prompt": "x" * 400, "max_tokens": 7}
        request = urllib.request.Request(
            engine.url + "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            reply = json.loads(response.read())
        assert reply["model"] == MODEL and reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"] == {"prompt_tokens": 100, "completion_tokens": 7,
                                  "total_tokens": 107}  # fmt: skip
        with urllib.request.urlopen(engine.url + "/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 7.0' in metrics
    finally:
        engine.stop()
