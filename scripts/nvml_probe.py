#!/usr/bin/env python3
"""Print what the agent's GPU telemetry reads on this host, as JSON lines.

Needs gpuroute installed (`pip install .`, nvidia-ml-py and aiohttp with it) but no agent
config, so it can check a GPU host before the agent is deployed:

    python3 scripts/nvml_probe.py --source auto --samples 5 [--load-seconds 5]

--load-seconds runs a matrix-multiply load with torch, when installed, between samples so
utilisation, power and temperature move."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import threading
import time


def gpu_load(seconds: float) -> None:
    try:
        import torch
    except ImportError:
        print(json.dumps({"load": "torch not installed; no load generated"}))
        return
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    print(json.dumps({"load": f"matmul load on {torch.cuda.get_device_name()} started"}))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        (a @ a).sum().item()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="auto", choices=["auto", "nvml", "simulated"])
    parser.add_argument("--simulated-url", default="http://127.0.0.1:8000/_gpu")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--load-seconds", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    from gpuroute.agent.amdsmi_source import open_gpu_source

    source = open_gpu_source(args.source, args.simulated_url)
    load = None
    if args.load_seconds > 0:
        load = threading.Thread(target=gpu_load, args=(args.load_seconds,), daemon=True)
        load.start()
    for _ in range(args.samples):
        reading = await source.read()
        print(json.dumps({
            "source": source.name,
            "error": reading.error,
            "util": reading.util,
            "memory_free": reading.memory_free,
            "throttled": reading.throttled,
            "gpus": [dataclasses.asdict(g) for g in reading.gpus],
        }), flush=True)  # fmt: skip
        await asyncio.sleep(args.interval)
    if load is not None:
        load.join()
    await source.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
