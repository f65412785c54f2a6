#!/usr/bin/env bash
# Makes a Terraform-compatible CLI available for the deployment tests and prints its path.
# `terraform` on PATH wins. Otherwise OpenTofu (a drop-in fork: same HCL, `fmt`, `test`,
# `validate`) is built once from the Go module proxy and cached outside the repo: the
# HashiCorp release site is not reachable from every build machine, the module proxy is.
# OpenTofu's go.mod has a replace directive, so it is built inside its module directory.
set -euo pipefail
if [ -z "${GPUROUTE_BUILD_TOFU:-}" ] && command -v terraform >/dev/null 2>&1; then
    command -v terraform; exit 0
fi
VERSION="${GPUROUTE_TOFU_VERSION:-1.10.5}"
CACHE="${GPUROUTE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuroute}"
BIN="$CACHE/tofu-$VERSION"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
if ! command -v go >/dev/null 2>&1; then
    echo "build-terraform: neither terraform nor Go found; install Terraform >= 1.6 or Go" >&2
    exit 1
fi
mkdir -p "$CACHE"
echo "build-terraform: building OpenTofu $VERSION (once; cached at $BIN)" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod
dir="$(go mod download -json "github.com/opentofu/opentofu@v$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
cp -r "$dir" "$work/src" && chmod -R u+w "$work/src" && cd "$work/src"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/tofu" ./cmd/tofu >&2
mv "$work/tofu" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
