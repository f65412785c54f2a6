#!/usr/bin/env bash
# The pinned Consul for tests, the demo and the fleet benchmark, built once from the Go module
# proxy (Consul is not packaged for Debian or PyPI). Prints the binary's path. Without Go it
# says how to get Consul and exits 0: the Consul tests then say the same (they fail under
# `make test`, skip under a plain pytest).
set -euo pipefail
VERSION="${GPUROUTE_CONSUL_VERSION:-1.22.2}"
if ! command -v go >/dev/null 2>&1; then
    echo "build-consul: Go not found; install Go >= 1.23 or set GPUROUTE_CONSUL to a consul $VERSION binary" >&2
    exit 0
fi
exec "$(dirname "$0")/go-build-module.sh" github.com/hashicorp/consul "$VERSION" . consul "~5-10 min"
