"""The two-model scenario the planner's tests share: an 8B taking nine requests in ten and a
70B at tensor parallel 2 taking the tenth, on H100s (`traffic(rate)` + `GPUS`)."""

from __future__ import annotations

TRAFFIC = """
name = "two"
seed = 5
{fleet}
[workload]
profile = "chat"
rate_rps = {rate}
max_requests = 1500
model = "llama-3.1-8b"
models = {{ "llama-3.1-8b" = 0.9, "llama-3.1-70b" = 0.1 }}
"""
GPUS = """
[[gpus]]
type = "H100"
count = 1
[[gpus]]
gpu = "H100"
count = 1
model = "llama-3.1-70b"
tensor_parallel = 2
"""
# a GPU type the planner's tests declare (the A100 variant with its NVLink cut)
A800 = (
    '[[gpu_types]]\nname = "A800"\nmemory_gb = 80\nmemory_bandwidth_tbs = 2.039\n'
    "fp16_tflops = 312\nprice_per_hour = 2.2\n"
)
SLO_70B = '[[models]]\nname = "llama-3.1-70b"\nslo = { ttft_s = 0.5, tpot_s = 0.04 }\n'


def traffic(rate: float = 40.0, fleet: str = "") -> str:
    """The scenario's traffic at `rate` requests per second (and a `fleet =` line, if any)."""
    return TRAFFIC.format(fleet=fleet, rate=rate)
