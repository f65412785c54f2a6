#!/usr/bin/env python3
"""Where a request's router CPU goes, under `gpuroute bench overhead`'s load.

The same setup as `bench overhead`'s default target (bench/overhead.py): one fake engine
at time scale 0.0001 with wrk on CPU 0, the router with its default config on CPU 1, tiny
non-streamed completions. wrk first runs unprofiled (the router's CPU per request, from
/proc), then again with cProfile switched on inside the router for that run alone
(SIGUSR1 on, SIGUSR2 off and dump), so start-up and warm-up are not in the table.

    flock /work/bench.lock .venv/bin/python scripts/profile-overhead.py \
        [--router-python OTHER/.venv/bin/python] [--connections 32] [--duration 10]
"""

from __future__ import annotations

import argparse
import io
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuroute.bench.process_stats import cpu_seconds
from gpuroute.bench.targets import router_config
from gpuroute.bench.wrk import ENGINE_CPU, PROXY_CPU, WRK_SCRIPT, wrk
from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, spawn, start_engine, wait_http

# run in the router's interpreter: gpuroute's CLI, with cProfile behind two signals
PROFILED = """
import cProfile, gc, signal, sys, time
from gpuroute.cli import main
profiler = cProfile.Profile()
pauses, started = {0: [], 1: [], 2: []}, [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.process_time()
    else:
        pauses[info["generation"]].append(time.process_time() - started[0])
def gc_timing(*_):  # the collector's CPU timed between one SIGWINCH and the next
    if timed not in gc.callbacks:
        gc.callbacks.append(timed)
        return
    gc.callbacks.remove(timed)
    for gen, p in pauses.items():
        if p:
            print(f"gc gen{gen}: {len(p)} collections, max {max(p)*1e3:.2f} ms, "
                  f"total {sum(p)*1e3:.1f} ms CPU", file=sys.stderr, flush=True)
        p.clear()
signal.signal(signal.SIGWINCH, gc_timing)
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
def dump(*_):
    profiler.disable()
    profiler.dump_stats(sys.argv[1])
signal.signal(signal.SIGUSR2, dump)
sys.exit(main(sys.argv[2:]))
"""


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or path.stat().st_size == 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"no profile written to {path}")
        time.sleep(0.1)
    time.sleep(0.5)  # the dump finishes writing


def sampled(args: argparse.Namespace, router: Child, script: Path) -> None:
    """py-spy's collapsed stacks of the router during one wrk run, to `args.out`."""
    spy = subprocess.Popen(
        [args.py_spy, "record", "-r", "1000", "-f", "raw", "-o", str(args.out),
         "-p", str(router.proc.pid), "-d", str(int(args.duration))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    result = wrk(router.url, args.connections, args.duration, script)
    spy.wait(60)
    print(f"sampled: {result['rps']:,.0f} req/s; stacks in {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router-python", default=sys.executable)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, help="keep the .prof file here")
    parser.add_argument("--py-spy", help="sample with this py-spy instead (collapsed stacks)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuroute-profile-") as tmp:
        workdir = Path(tmp)
        script = workdir / "post.lua"
        script.write_text(WRK_SCRIPT)
        engine = start_engine(
            workdir, 0, "H100", time_scale=0.0001, stream_interval_ms=0, cpu=ENGINE_CPU
        )
        port = free_port()
        config = workdir / "router.toml"
        config.write_text(router_config([("H100", engine)], port, "least_outstanding_work"))
        prof = args.out or workdir / "router.prof"
        cmd = [args.router_python, "-c", PROFILED, str(prof), "router", "--config", str(config)]
        router = spawn("router", cmd, workdir, port, cpu=PROXY_CPU)
        try:
            wait_http(engine.url + "/health", 30, engine, "fake engine")
            wait_http(router.url + "/v1/models", 30, router, "router")
            count = measure(args, router, script, prof)
        finally:
            router.stop()
            engine.stop()
            pauses = [ln for ln in router.log.read_text().splitlines() if ln.startswith("gc ")]
            print("\n".join(pauses))  # warm-up, then the unprofiled run
        if count:
            report(prof, count, args.top)


def measure(args: argparse.Namespace, router: Child, script: Path, prof: Path) -> float:
    """The unprofiled run (printed), then the profiled or sampled one: its requests (0
    when sampled)."""
    wrk(router.url, 4, 2.0, script)  # warm connections and caches
    router.signal(signal.SIGWINCH)  # the GC's pauses counted from here
    before = cpu_seconds(router.proc.pid)
    plain = wrk(router.url, args.connections, args.duration, script)
    used = cpu_seconds(router.proc.pid) - before
    router.signal(signal.SIGWINCH)
    requests = plain["rps"] * args.duration
    print(
        f"unprofiled: {plain['rps']:,.0f} req/s, p50 {plain['p50_ms']:.3f} ms, "
        f"p99 {plain['p99_ms']:.3f} ms, router {used / args.duration:.2f} cores, "
        f"{used / requests * 1e6:.1f} us CPU a request"
    )
    if args.py_spy:
        sampled(args, router, script)
        return 0.0
    router.signal(signal.SIGUSR1)
    profiled = wrk(router.url, args.connections, args.duration, script)
    router.signal(signal.SIGUSR2)
    wait_for(prof)
    print(f"profiled: {profiled['rps']:,.0f} req/s")
    return profiled["rps"] * args.duration


def report(prof: Path, count: float, top: int) -> None:
    """The table: top functions by own time, and the profiled CPU a request."""
    out = io.StringIO()
    stats = pstats.Stats(str(prof), stream=out)
    print(
        f"{count:,.0f} requests profiled, {stats.total_tt:.2f} s profiled CPU, "
        f"{stats.total_tt / count * 1e6:.1f} us a request (cProfile's own cost included)"
    )
    stats.sort_stats("tottime").print_stats(top)
    print(out.getvalue()[out.getvalue().index("   ncalls") :])


if __name__ == "__main__":
    main()
