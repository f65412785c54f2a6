#!/usr/bin/env bash
# SLO capacity of every scenario in bench/scenarios under the baselines and the default
# policy, then the geometric means and the overload ratios (docs/benchmarks.md).
# Usage: scripts/capacity-matrix.sh [OUT_DIR]   (trace scenarios skip without ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/capacity}
mkdir -p "$out"
gpuroute=${GPUROUTE:-.venv/bin/gpuroute}
run_one() {
  local file=$1 name
  name=$(basename "$file" .toml)
  if grep -q '^trace = "../../../shared' "$file" && [ ! -d ../shared/data ]; then
    echo "skip $name: ../shared/data is absent" >&2
    return 0
  fi
  "$gpuroute" capacity --scenario "$file" --policy least_connections \
    --policy least_outstanding_work --policy default --quiet --json "$out/$name.json"
  echo "done $name" >&2
}
export -f run_one
export out gpuroute
ls bench/scenarios/*.toml | xargs -P "${JOBS:-2}" -I{} bash -c 'run_one {}'
.venv/bin/python scripts/capacity_summary.py "$out"
