"""Config lines for routers and global tiers that tests, benchmarks and the demo run on
loopback: their admin routes on the public port, and the answering backend named in each
answer (both off by default, since they show the fleet's topology)."""

EXPOSE_BACKEND = "expose_backend_header = true\n"
# A replayed trace's true answer length, for the fake engine (bench/loadgen.py sends it).
# Engines get an allow-list of a client's headers, so a testbed router names this one.
REPLAY_LENGTHS = 'engine_headers = ["x-fake-output-tokens"]\n'
TESTBED_ROUTER = EXPOSE_BACKEND + REPLAY_LENGTHS
ROUTER_ON_LOOPBACK = "admin_on_public_listener = true\n" + TESTBED_ROUTER
GLOBAL_ON_LOOPBACK = "admin_on_public_listener = true\n"
