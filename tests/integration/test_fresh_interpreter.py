"""What only a fresh Python process shows: what building the CLI imports, and that the
canary split does not depend on the process's hash seed. Each starts an interpreter, so
they live here rather than in the pure tests/unit."""

from __future__ import annotations

import os
import subprocess
import sys

from gpuroute.router.core.model_routes import split_bucket
from gpuroute.router.front.parse import session_key


def test_building_the_cli_loads_no_simulator_benchmark_or_testbed_code() -> None:
    """Every router, agent and fake-engine process builds the whole parser at start-up; a
    registration module that imports its package's work (numpy, rich, the simulator) makes
    each of them start slower and bigger."""
    probe = (
        "import sys, gpuroute.cli as cli; cli.build_parser(); "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    loaded = set(done.stdout.split())
    heavy = {"numpy", "rich", "aiohttp", "grpc", "redis"} & loaded
    rooms = ("gpuroute.sim.", "gpuroute.bench.", "gpuroute.testbed.", "gpuroute.demo.")
    work = {m for m in loaded if m.startswith(rooms) and not m.endswith(".cli")}
    assert not heavy and not work, sorted(heavy | work)


def test_buckets_do_not_depend_on_the_process_hash_seed() -> None:
    """Another process (another PYTHONHASHSEED) puts every session in the same bucket."""
    script = (
        "from gpuroute.router.core.model_routes import split_bucket\n"
        "from gpuroute.router.front.parse import session_key\n"
        "print(repr([split_bucket('m', session_key(f'user-{i}')) for i in range(200)]))\n"
    )

    def run(seed: str) -> str:
        env = os.environ | {"PYTHONHASHSEED": seed}
        command = [sys.executable, "-c", script]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        return done.stdout

    outs = [run("1"), run("2")]
    here = repr([split_bucket("m", session_key(f"user-{i}")) for i in range(200)])
    assert outs == [here + "\n", here + "\n"]
