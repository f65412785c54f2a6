"""The peer routers the benchmarks compare against: the SGLang Model Gateway
(`sglang-router`) and the vLLM router (`vllm-router`), both Rust, installed from PyPI into
their own cached environment by `scripts/build-peer-routers.sh` (`make peer-routers`).

Each runs as its docs show it (`--worker-urls` and `--policy`, every other setting at its
default), on loopback, with its Prometheus port moved to a free one so that two can run."""

from __future__ import annotations

import os
from pathlib import Path

from gpuroute.testbed.processes import installed_venv

SMG_VERSION, VLLM_ROUTER_VERSION = "0.3.2", "0.1.17"  # the build script pins the same
HOW_TO_GET_PEER_ROUTERS = (
    "peer routers not found: run `make peer-routers` (installs sglang-router "
    f"{SMG_VERSION} and vllm-router {VLLM_ROUTER_VERSION} from PyPI into ~/.cache/gpuroute), "
    "or set GPUROUTE_PEER_ROUTERS_BIN to a folder holding both"
)
# baseline name -> (program, policy)
PEER_ROUTERS: dict[str, tuple[str, str]] = {
    "smg-cache-aware": ("sglang-router", "cache_aware"),
    "smg-p2c": ("sglang-router", "power_of_two"),
    "vllm-router-cache-aware": ("vllm-router", "cache_aware"),
    "vllm-router-p2c": ("vllm-router", "power_of_two"),
}


def peer_routers_bin() -> Path | None:
    """GPUROUTE_PEER_ROUTERS_BIN, else the cached environment once fully installed."""
    if env := os.environ.get("GPUROUTE_PEER_ROUTERS_BIN"):
        return Path(env) if Path(env).is_dir() else None
    venv = installed_venv(f"peer-routers-smg{SMG_VERSION}-vllmrouter{VLLM_ROUTER_VERSION}")
    return venv / "bin" if venv is not None else None


def peer_router_command(
    name: str, workers: list[str], port: int, metrics_port: int, bin_dir: Path
) -> list[str]:
    """The command line of baseline `name` in front of `workers` (engine base URLs)."""
    program, policy = PEER_ROUTERS[name]
    common = [
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
        "--policy", policy, "--prometheus-port", str(metrics_port),
        "--request-timeout-secs", "900",  # as long as the other baselines wait
    ]  # fmt: skip
    if program == "sglang-router":
        return [str(bin_dir / program), "launch", *common]
    return [str(bin_dir / program), *common]
