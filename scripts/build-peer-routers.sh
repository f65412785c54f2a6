#!/usr/bin/env bash
# The peer routers the live benchmarks compare against, installed once from PyPI (they ship
# as wheels with their Rust binaries) into their own cached virtual environment: the SGLang
# Model Gateway (`sglang-router`) and the vLLM router (`vllm-router`). Prints the
# environment's bin folder. GPUROUTE_PEER_ROUTERS_BIN skips this (a folder holding both).
set -euo pipefail
SMG="${GPUROUTE_SMG_VERSION:-0.3.2}"
VLLM_ROUTER="${GPUROUTE_VLLM_ROUTER_VERSION:-0.1.17}"
if [ -n "${GPUROUTE_PEER_ROUTERS_BIN:-}" ]; then
    echo "$GPUROUTE_PEER_ROUTERS_BIN"
    exit 0
fi
venv="${XDG_CACHE_HOME:-$HOME/.cache}/gpuroute/peer-routers-smg$SMG-vllmrouter$VLLM_ROUTER"
if [ -f "$venv/.installed" ]; then
    echo "$venv/bin"
    exit 0
fi
echo "build-peer-routers: installing sglang-router $SMG and vllm-router $VLLM_ROUTER from PyPI into $venv (first run only, ~1-2 min)" >&2
rm -rf "$venv"  # a half-built one (no .installed)
python3 -m venv "$venv"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" "sglang-router==$SMG" "vllm-router==$VLLM_ROUTER"
touch "$venv/.installed"
echo "build-peer-routers: installed" >&2
echo "$venv/bin"
