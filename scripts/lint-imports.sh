#!/usr/bin/env bash
# Check the import-linter contracts in pyproject.toml against the package as a wheel lays it
# out (gpuroute/router, gpuroute/global_, ...): the editable install maps folders through an
# import hook that import-linter cannot walk, so the tree is copied into build/ first.
set -euo pipefail
cd "$(dirname "$0")/.."
lint="${LINT_IMPORTS:-$(command -v lint-imports)}"
lint="$(readlink -f "$lint")"  # absolute: the check runs from the copied tree
out=build/import-graph
rm -rf "$out"
mkdir -p "$out"
cp -r gpuroute "$out/gpuroute"
for pkg in router agent sim planner fleet testbed bench demo; do
    cp -r "$pkg" "$out/gpuroute/$pkg"
done
cp -r global "$out/gpuroute/global_"
find "$out" -name __pycache__ -prune -exec rm -rf {} +
cd "$out"
PYTHONPATH=. exec "$lint" --config ../../pyproject.toml "$@"
