"""A pool's engine command line, from the fleet file: the arguments every host of the pool
starts its engines with (Terraform adds each engine's `--host` and `--port`)."""

from __future__ import annotations

from gpuroute.fleet.schema import DeployFleet

from gpuroute.regions import EngineSettings, GpuPool


def engine_argv(fleet: DeployFleet, pool: GpuPool) -> list[str]:
    """vLLM's `vllm serve` or SGLang's `sglang.launch_server` arguments, without host and
    port; the weights of the pool's first model, served under all of its names."""
    settings = fleet.engine_of(pool)
    weights = fleet.weights(pool.models[0]) or pool.models[0]
    if settings.kind == "sglang":
        return _sglang(settings, pool, weights)
    return _vllm(settings, pool, weights)


def _vllm(settings: EngineSettings, pool: GpuPool, weights: str) -> list[str]:
    argv = ["--model", weights, "--served-model-name", *pool.models]
    argv += ["--tensor-parallel-size", str(pool.tensor_parallel)]
    argv += ["--pipeline-parallel-size", str(pool.pipeline_parallel)]
    if settings.max_model_len is not None:
        argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.quantization is not None:
        argv += ["--quantization", settings.quantization]
    if settings.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{settings.gpu_memory_utilization:g}"]
    if settings.lora_modules:
        argv += ["--enable-lora", "--lora-modules"]
        argv += [f"{name}={path}" for name, path in settings.lora_modules.items()]
    return argv + list(settings.extra_args)


def _sglang(settings: EngineSettings, pool: GpuPool, weights: str) -> list[str]:
    # SGLang serves one name; the router's [[models]] aliases give the others
    argv = ["--model-path", weights, "--served-model-name", pool.models[0]]
    argv += ["--tp-size", str(pool.tensor_parallel), "--pp-size", str(pool.pipeline_parallel)]
    if settings.max_model_len is not None:
        argv += ["--context-length", str(settings.max_model_len)]
    if settings.quantization is not None:
        argv += ["--quantization", settings.quantization]
    if settings.gpu_memory_utilization is not None:
        argv += ["--mem-fraction-static", f"{settings.gpu_memory_utilization:g}"]
    if settings.lora_modules:
        argv += ["--enable-lora", "--lora-paths"]
        argv += [f"{name}={path}" for name, path in settings.lora_modules.items()]
    return [*argv, "--enable-metrics", *settings.extra_args]
