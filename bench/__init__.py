"""Live benchmarks: load generator, baseline proxies, each benchmark, fault reports, plots."""
