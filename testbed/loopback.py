"""Config lines for routers and global tiers that tests, benchmarks and the demo run on
loopback: their admin routes on the public port, and the answering backend named in each
answer (both off by default, since they show the fleet's topology)."""

ROUTER_ON_LOOPBACK = "admin_on_public_listener = true\nexpose_backend_header = true\n"
GLOBAL_ON_LOOPBACK = "admin_on_public_listener = true\n"
