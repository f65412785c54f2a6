#!/usr/bin/env bash
# A Terraform-compatible CLI for the deployment tests; prints its path. `terraform` on PATH
# wins. Otherwise OpenTofu (a drop-in fork: same HCL, `fmt`, `test`, `validate`) is built once
# from the Go module proxy, which build machines reach when HashiCorp's release site is not.
set -euo pipefail
if [ -z "${GPUROUTE_BUILD_TOFU:-}" ] && command -v terraform >/dev/null 2>&1; then
    command -v terraform; exit 0
fi
VERSION="${GPUROUTE_TOFU_VERSION:-1.10.5}"
if ! command -v go >/dev/null 2>&1; then
    echo "build-terraform: neither terraform nor Go found; install Terraform >= 1.6 or Go" >&2
    exit 1
fi
exec "$(dirname "$0")/go-build-module.sh" github.com/opentofu/opentofu "$VERSION" ./cmd/tofu tofu \
    "~5 min"
