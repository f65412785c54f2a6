"""`gpuroute fake-engine`: a simulated GPU engine with vLLM's OpenAI API and metrics."""

from __future__ import annotations

import argparse
import sys

from gpuroute import log_flags


def register(sub) -> None:
    fake = sub.add_parser(
        "fake-engine", help="serve a simulated GPU engine with vLLM's OpenAI API and metrics"
    )
    fake.add_argument(
        "--gpu", default="H100", help="GPU type: a built-in (H100, A100, L4, ...) or --specs's"
    )
    fake.add_argument("--port", type=int, default=8000)
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument(
        "--model", default="llama-3.1-8b", help="engine model shape: a built-in or --specs's"
    )
    fake.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="GPUs the engine spans (weights, KV cache and compute split over them)",
    )
    fake.add_argument(
        "--specs",
        metavar="FILE",
        help="TOML file whose [[gpu_types]] and [[models]] add GPU types and model shapes "
        "(a scenario or a router config; nothing else in it is read)",
    )
    fake.add_argument("--served-name", help="model name in the API (default: --model)")
    fake.add_argument(
        "--time-scale", type=float, default=1.0, help="run this many times slower than the GPU"
    )
    fake.add_argument("--default-output-tokens", type=int, default=128)
    fake.add_argument("--stream-interval-ms", type=float, default=20.0)
    fake.add_argument(
        "--token-interval-ms",
        type=float,
        help="one token per SSE event, this far apart (relay benchmarks)",
    )
    fake.add_argument("--seed", type=int, default=0)
    log_flags.add_arguments(fake)
    fake.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from gpuroute.testbed.fake_engine.server import run_fake_engine

    from gpuroute.logs import configure_from

    configure_from(args)
    try:
        config = fake_engine_config(args)
    except ValueError as exc:  # ConfigError too: it names the file and the key
        print(f"gpuroute fake-engine: error: {exc}", file=sys.stderr)
        return 2
    run_fake_engine(config)
    return 0


def fake_engine_config(args: argparse.Namespace):
    """The engine's settings from its arguments; ValueError saying which one is wrong."""
    from gpuroute.testbed.engine_specs import BUILTIN_SPECS, load_engine_specs
    from gpuroute.testbed.fake_engine.config import FakeEngineConfig

    specs = BUILTIN_SPECS if args.specs is None else load_engine_specs(args.specs)
    return FakeEngineConfig(
        gpu=args.gpu,
        model=args.model,
        served_name=args.served_name,
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        default_output_tokens=args.default_output_tokens,
        stream_interval_s=args.stream_interval_ms / 1000,
        token_interval_s=None if args.token_interval_ms is None else args.token_interval_ms / 1000,
        seed=args.seed,
        gpu_spec=specs.gpu(args.gpu),
        model_spec=specs.model(args.model),
        tensor_parallel=args.tensor_parallel,
    )
