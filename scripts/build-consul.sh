#!/usr/bin/env bash
# Builds one pinned Consul release from the Go module proxy, once, and caches the binary
# outside the repo. Consul's go.mod carries replace directives, so `go install` refuses it:
# download the module, then `go build` inside its directory.
# Prints the binary's path on success. Without Go it says how to get Consul and exits 0
# (the Consul tests then skip with the same message).
set -euo pipefail
VERSION="${GPUROUTE_CONSUL_VERSION:-1.22.2}"
CACHE="${GPUROUTE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuroute}"
BIN="$CACHE/consul-$VERSION"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
if ! command -v go >/dev/null 2>&1; then
    echo "build-consul: Go not found; install Go >= 1.23 or put a consul $VERSION binary at $BIN" >&2
    exit 0
fi
mkdir -p "$CACHE"
echo "build-consul: building consul $VERSION (once; cached at $BIN)" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod
# Registry mirrors may not serve checksum-database lookups for Consul's nested modules;
# their hashes are then recorded from the proxy's zips instead.
export GONOSUMDB="${GONOSUMDB:-github.com/hashicorp/consul}"
download() { go mod download -json "github.com/hashicorp/consul@v$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }
dir="$(download || { echo "build-consul: download failed; retrying once" >&2; sleep 5; download; })"
cp -r "$dir" "$work/src" && chmod -R u+w "$work/src" && cd "$work/src"
for m in $(awk '$2 == "=>" && $3 ~ /^\.\// {print $1}' go.mod); do
    go mod edit -dropreplace="$m"
done
build() {
    CGO_ENABLED=0 go build -trimpath -o "$work/consul" \
        -ldflags "-s -w -X github.com/hashicorp/consul/version.GitCommit=gomodproxy" . >&2
}
build || { echo "build-consul: build failed; retrying once" >&2; sleep 5; build; }
mv "$work/consul" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
