"""Many simulated GPU hosts in one process: N fake engines, each with its own node agent
registering in Consul and streaming load. It lets one machine play a 50-host fleet for the
membership benchmark (`gpuroute bench fleet`) and the demo, with the agents' real code.

    python -m gpuroute.testbed.fleet_host --hosts 50 --consul http://127.0.0.1:8500 \
        --gpus H100,A100,L4 --time-scale 2 --ready FILE

Prints one JSON line per host once all are serving, and writes it to --ready."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path

from aiohttp import web
from gpuroute.agent.config import AgentConfig
from gpuroute.agent.server import Agent
from gpuroute.testbed.fake_engine.server import VLLM_BACKLOG, FakeEngine, FakeEngineConfig
from gpuroute.testbed.ports import free_ports
from gpuroute.testbed.processes import Child, StartError, spawn

from gpuroute import runtime


def host_config(
    index: int, gpu: str, engine_port: int, consul: str | None, *, sample_s: float
) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "id": f"sim-{index:03d}-{gpu.lower()}",
            "zone": f"local-{'abc'[index % 3]}",
            "engine": {
                "url": f"http://127.0.0.1:{engine_port}",
                "models": ["llama-3.1-8b"],
                "gpu": gpu,
            },
            "telemetry": {"source": "simulated", "interval_s": sample_s},
            "consul": {"enabled": consul is not None, "address": consul or "http://x:1"},
            "load_stream": {"port": 0},
            "admin": {"port": 0},
            "drain_grace_s": 0.5,
        }
    )


async def run_hosts(args: argparse.Namespace) -> None:
    gpus = [g for g in args.gpus.split(",") if g]
    runners, agents, hosts = [], [], []
    for index, port in enumerate(free_ports(args.hosts)):
        gpu = gpus[index % len(gpus)]
        engine = FakeEngine(
            FakeEngineConfig(gpu=gpu, port=port, time_scale=args.time_scale, seed=index)
        )
        runner = web.AppRunner(engine.app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=VLLM_BACKLOG).start()
        runners.append(runner)
        agent = Agent(host_config(index, gpu, port, args.consul, sample_s=args.sample_s))
        await agent.start()
        agents.append(agent)
        hosts.append(
            {
                "id": agent.config.service_id,
                "gpu": gpu,
                "engine": f"http://127.0.0.1:{port}",
                "load_port": agent.load_port,
                "admin_port": agent.admin_port,
            }
        )
    text = "\n".join(json.dumps(h) for h in hosts)
    if args.ready:  # written whole, then renamed: a reader never sees half of it
        partial = Path(args.ready + ".partial")
        partial.write_text(text + "\n")
        partial.replace(args.ready)
    print(text, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for agent in agents:
        await agent.stop()
    for runner in runners:
        await runner.cleanup()


def start_fleet_host(
    workdir: Path,
    name: str,
    hosts: int,
    gpus: str,
    *,
    consul: str | None = None,
    time_scale: float = 1.0,
    timeout: float = 90.0,
) -> tuple[Child, list[dict]]:
    """Run this module as a child process; return it and its hosts once all serve."""
    ready = workdir / f"{name}.jsonl"
    ready.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "gpuroute.testbed.fleet_host", "--hosts", str(hosts),
           "--gpus", gpus, "--time-scale", str(time_scale), "--ready", str(ready)]  # fmt: skip
    if consul:
        cmd += ["--consul", consul]
    child = spawn(name, cmd, workdir, 0)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if child.proc.poll() is not None or time.monotonic() > deadline:
            child.stop()
            raise StartError(f"simulated hosts did not start; see {child.log}")
        time.sleep(0.1)  # polling a file another process writes
    return child, [json.loads(line) for line in ready.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--consul", help="Consul HTTP address (omit: no registration)")
    parser.add_argument("--gpus", default="H100,A100,L4")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--sample-s", type=float, default=0.2)
    parser.add_argument("--ready", help="write the host list here once all serve")
    args = parser.parse_args(argv)
    runtime.configure_logging(logging.WARNING)
    runtime.run(run_hosts(args), fast_loop=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
