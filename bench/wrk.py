"""wrk, the load client of `gpuroute bench overhead` and its `--workers` scaling run, and
the two cores every pinned benchmark splits: the engine and its client on one, the proxy
under test alone on the other."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gpuroute.bench.targets import BenchError
from gpuroute.testbed.processes import require

ENGINE_CPU, PROXY_CPU = 0, 1
WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 1}'
"""
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(output: str) -> dict[str, float]:
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+(?:us|ms|s))", output, re.M))
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if rps is None or "50" not in lat or "99" not in lat:
        raise BenchError(f"could not read wrk output:\n{output}")

    def ms(text: str) -> float:
        number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
        return float(number) * UNITS[unit]

    return {
        "rps": float(rps.group(1)),
        "p50_ms": ms(lat["50"]),
        "p99_ms": ms(lat["99"]),
        "non_2xx": int(errors.group(1)) if errors else 0,
    }


def wrk(url: str, connections: int, duration: float, script: Path) -> dict[str, float]:
    cmd = [
        "taskset", "-c", str(ENGINE_CPU), require("wrk"), "-t1", f"-c{connections}",
        f"-d{duration:g}s", "--latency", "-s", str(script), url + "/v1/completions",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    if done.returncode != 0:
        raise BenchError(f"wrk failed: {done.stderr or done.stdout}")
    return parse_wrk(done.stdout)
