"""A pool's engine command line, from the fleet file: the arguments every host of the pool
starts its engines with (Terraform adds each engine's `--host` and `--port`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuroute.fleet.schema import DeployFleet

from gpuroute.regions import GpuPool


@dataclass(frozen=True, slots=True)
class EngineFlags:
    """How one engine spells what the fleet file says (the options gpuroute renders)."""

    weights: str
    every_name: bool  # serves every name of the pool (vLLM), or the first alone (SGLang)
    tensor_parallel: str
    pipeline_parallel: str
    context: str
    memory: str
    lora_paths: str
    always: tuple[str, ...] = ()


FLAGS = {
    "vllm": EngineFlags(
        "--model", True, "--tensor-parallel-size", "--pipeline-parallel-size",
        "--max-model-len", "--gpu-memory-utilization", "--lora-modules",
    ),
    # SGLang serves one name (the router's [[models]] aliases give the others); the agent
    # reads its metrics
    "sglang": EngineFlags(
        "--model-path", False, "--tp-size", "--pp-size", "--context-length",
        "--mem-fraction-static", "--lora-paths", ("--enable-metrics",),
    ),
}  # fmt: skip


def engine_argv(fleet: DeployFleet, pool: GpuPool) -> list[str]:
    """vLLM's `vllm serve` or SGLang's `sglang.launch_server` arguments, without host and
    port; the weights of the pool's first model, served under its names."""
    settings = fleet.engine_of(pool)
    flags = FLAGS[settings.kind]
    names = pool.models if flags.every_name else pool.models[:1]
    argv = [flags.weights, fleet.weights(pool.models[0]) or pool.models[0]]
    argv += ["--served-model-name", *names]
    argv += [flags.tensor_parallel, str(pool.tensor_parallel)]
    argv += [flags.pipeline_parallel, str(pool.pipeline_parallel)]
    memory = settings.gpu_memory_utilization
    optional = (
        (flags.context, settings.max_model_len),
        ("--quantization", settings.quantization),
        (flags.memory, None if memory is None else f"{memory:g}"),
    )
    argv += [item for flag, value in optional if value is not None for item in (flag, str(value))]
    if settings.lora_modules:
        argv += ["--enable-lora", flags.lora_paths]
        argv += [f"{name}={path}" for name, path in settings.lora_modules.items()]
    return [*argv, *flags.always, *settings.extra_args]
