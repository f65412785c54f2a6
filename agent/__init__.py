"""Per-host agent: GPU and engine telemetry, Consul registration, load stream."""
