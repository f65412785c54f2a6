"""Config lines for routers and global tiers that tests, benchmarks and the demo run on
loopback: their admin routes on the public port, and the answering backend named in each
answer (both off by default, since they show the fleet's topology)."""

EXPOSE_BACKEND = "expose_backend_header = true\n"
ROUTER_ON_LOOPBACK = "admin_on_public_listener = true\n" + EXPOSE_BACKEND
GLOBAL_ON_LOOPBACK = "admin_on_public_listener = true\n"
