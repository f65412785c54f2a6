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


def consul_router_toml(
    port: int, admin_port: int, consul: str, admin_token_file: str, *, tick_s: float = 0.1
) -> str:
    """A router on loopback that finds its engines in Consul, its admin API on a listener
    of its own behind an admin token (as deployed); sections may follow."""
    return (
        TESTBED_ROUTER + f'tick_s = {tick_s}\nadmin_token_file = "{admin_token_file}"\n'
        f"[listen]\nport = {port}\n[admin_listen]\nport = {admin_port}\n"
        f'[membership]\nconsul = "{consul}"\nwait_s = 5\n'
    )


def quick_autoscale_toml(model: str, capacity_rps: float = 2.0, max_backends: int = 4) -> str:
    """A router's [autoscale] that reacts within seconds (the demo's and the live tests'):
    one backend of `model` serves `capacity_rps` within the SLO, rates are smoothed over
    2 s, a pool shrinks after 3 s and keeps 1 to max_backends - 1 in rotation, 1 standby."""
    return (
        f'[autoscale]\ninterval_s = 0.5\ncapacity_rps = {{ "{model}" = {capacity_rps} }}\n'
        "lead_time_s = 2\nrate_window_s = 2\ntrend_window_s = 4\nscale_down_after_s = 3\n"
        "release_after_s = 2\nmin_backends = 1\nstandby_backends = 1\n"
        f"max_backends = {max_backends}\n[autoscale.seasonal]\nenabled = false\n"
    )
