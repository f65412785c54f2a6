#!/usr/bin/env bash
# An OpenTelemetry Collector for the tracing test (OTLP receiver, file exporter), built once
# with the collector's builder from the Go module proxy (~2-3 min on 2 cores; cached in
# ~/.cache/gpuroute). Prints the binary's path. Without Go it says so and exits 0: the
# collector test then skips (fails under `make test`).
# The builder's own `go mod tidy` also resolves the file exporter's test-only modules, one of
# which the proxy refuses (otlpencodingextension v0.165.0: 403), so it only generates the
# sources here and `go build -mod=mod` fetches what the binary itself imports.
set -euo pipefail
VERSION="${GPUROUTE_OTELCOL_VERSION:-0.165.0}"
CACHE="${GPUROUTE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuroute}"
BIN="$CACHE/otelcol-gpuroute-$VERSION"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
if ! command -v go >/dev/null 2>&1; then
    echo "build-otelcol: Go not found; install Go >= 1.24 or set GPUROUTE_OTELCOL to a collector with the otlp receiver and file exporter" >&2
    exit 0
fi
mkdir -p "$CACHE"
echo "build-otelcol: building the OpenTelemetry Collector $VERSION (first run only, ~3 min; cached at $BIN)" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod GOBIN="$work/bin"
go install "go.opentelemetry.io/collector/cmd/builder@v$VERSION" >&2
cat > "$work/manifest.yaml" <<MANIFEST
dist:
  name: otelcol-gpuroute
  description: OpenTelemetry Collector for gpuroute's tracing test (OTLP in, file out)
  output_path: $work/src
receivers:
  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver v$VERSION
exporters:
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter v$VERSION
MANIFEST
# its `go mod tidy` fails as above once go.mod and the sources are written: built anyway
"$work/bin/builder" --config "$work/manifest.yaml" --skip-compilation >&2 \
    || echo "build-otelcol: (the builder's go mod tidy failed; building what it wrote)" >&2
cd "$work/src" && test -f go.mod
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/otelcol" . >&2
mv "$work/otelcol" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "build-otelcol: built" >&2
echo "$BIN"
