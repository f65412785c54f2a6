#!/usr/bin/env bash
# Rebalancing (a scenario's [rebalance]) against none, the default policy alone: the SLO
# capacity of every bench/scenarios file and of its copy with `[rebalance] enabled = true`,
# then, on the copy at the original's capacity, the streams moved and what their prefill
# again cost (docs/benchmarks.md, "Rebalancing running streams"). A result already in
# OUT_DIR is kept (delete it to measure again).
# Usage: scripts/rebalance-matrix.sh [OUT_DIR]   (trace scenarios skip without ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/rebalance}
mkdir -p "$out"
gpuroute=${GPUROUTE:-.venv/bin/gpuroute}
python=${PYTHON:-.venv/bin/python}
here=$(pwd)/bench/scenarios
for file in bench/scenarios/*.toml; do
  name=$(basename "$file" .toml)
  if grep -q '^trace = "../../../shared' "$file" && [ ! -d ../shared/data ]; then
    echo "skip $name: ../shared/data is absent" >&2
    continue
  fi
  # the copy reads the same trace (its relative path made absolute), rebalancing on
  sed "s#^trace = \"\\(\\.\\./[^\"]*\\)\"#trace = \"$here/\\1\"#" "$file" > "$out/$name-on.toml"
  printf '\n[rebalance]\nenabled = true\n' >> "$out/$name-on.toml"
  for side in off on; do
    scenario=$file
    [ "$side" = on ] && scenario=$out/$name-on.toml
    [ -s "$out/$name-$side.json" ] || "$gpuroute" capacity --scenario "$scenario" \
      --policy default --quiet --json "$out/$name-$side.json"
  done
  echo "done $name" >&2
done
"$python" scripts/rebalance_summary.py "$out"
