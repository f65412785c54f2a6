"""Global tier: geo/latency routing, spillover, residency, cross-region failover."""
