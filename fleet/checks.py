"""What deploying a fleet file needs beyond its shape, each problem said as `key: message`
with the numbers that decide it: an instance type for every pool in an AWS region, a model
that fits its engine's GPUs, weights to load, secrets the file names, engine arguments the
engine accepts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpuroute.fleet.engine_args import engine_argv
from gpuroute.fleet.engine_flags import check_engine_args
from gpuroute.fleet.instances import InstanceType, NoInstance, gpu_on, instance_for
from gpuroute.fleet.schema import GATED_PREFIXES, DeployFleet, PoolRef, read_deploy_fleet

from gpuroute.config import ConfigError
from gpuroute.gpus import GpuSpec
from gpuroute.models import WEIGHT_DTYPE_BYTES, ModelSpec
from gpuroute.roofline import DEFAULT_MEMORY_UTILIZATION, kv_capacity_tokens, usable_bytes

# weight bytes per parameter of an engine's --quantization (None: the model's shape's)
QUANTIZATION_BYTES = {
    "fp8": 1.0, "fbgemm_fp8": 1.0, "modelopt": 1.0, "compressed-tensors": None,
    "awq": 0.5, "awq_marlin": 0.5, "gptq": 0.5, "gptq_marlin": 0.5, "bitsandbytes": 0.5,
    "mxfp4": WEIGHT_DTYPE_BYTES["mxfp4"],
}  # fmt: skip


def load_deploy_fleet(path: Path | str) -> DeployFleet:
    """A fleet file read and validated, and what deploying it needs checked: ConfigError
    lists every problem as `file: key: message`."""
    fleet = read_deploy_fleet(path)
    problems = deployment_problems(fleet)
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems))
    return fleet


def deployment_problems(fleet: DeployFleet) -> list[str]:
    """Every problem of every pool (all of them, not the first)."""
    problems = [f"engine.hf_token: {p}" for p in _missing_secret(fleet, fleet.engine.hf_token)]
    for ref in fleet.pools():
        problems += [f"{ref.key}: {p}" for p in pool_problems(fleet, ref)]
    return problems


def pool_problems(fleet: DeployFleet, ref: PoolRef) -> list[str]:
    pool, problems = ref.pool, []
    shapes = fleet.shapes()
    first = pool.models[0]  # the weights loaded; the other names serve the same ones
    if first not in shapes and not _served_version(fleet, first):
        problems.append(f"models[0]: unknown model {first!r}; declare it under [[models]]")
    deploys = ref.region.deploy.aws_region is not None and pool.count > 0
    if not deploys:  # simulated or run by hand: only what every engine needs
        return problems + _fit_problems(fleet, ref, None)
    if fleet.weights(first) is None:
        problems.append(
            f"models[0]: no weights for {first!r}: give its [[models]] entry `weights` (a "
            "Hugging Face repository or a path on the host)"
        )
    problems += _secret_problems(fleet, ref)
    instance = None
    try:
        instance = instance_for(fleet, pool)
    except NoInstance as exc:
        problems.append(str(exc))
    if fleet.engine_of(pool).kind == "sglang" and len(pool.models) > 1:
        problems.append(
            "models: an SGLang engine serves one name; give the others as [[models]] aliases"
        )
    return problems + _fit_problems(fleet, ref, instance) + _argument_problems(fleet, ref)


def _fit_problems(fleet: DeployFleet, ref: PoolRef, instance: InstanceType | None) -> list[str]:
    """The pool's first model in its engine's GPUs (their instance's memory, where known)."""
    shapes = fleet.shapes()
    first = ref.pool.models[0]
    if first not in shapes:
        return []
    spec = gpu_on(fleet.gpu_catalog()[ref.pool.gpu], instance)
    short = memory_short(fleet, ref, spec, shapes[first])
    return [] if short is None else [short]


def _served_version(fleet: DeployFleet, name: str) -> bool:
    return any(name in m.split for m in fleet.models)


def _secret_problems(fleet: DeployFleet, ref: PoolRef) -> list[str]:
    token = fleet.engine_of(ref.pool).hf_token
    if token is not None and token not in fleet.secrets:  # the fleet's [engine] says it once
        own = ref.pool.engine.hf_token is not None
        return [f"engine.hf_token: {p}" for p in _missing_secret(fleet, token)] if own else []
    weights = fleet.weights(ref.pool.models[0]) or ""
    if token is None and weights.startswith(GATED_PREFIXES):
        return [
            f"engine.hf_token: {weights} is a gated Hugging Face repository: hosts need a "
            "token to download it; name a [secrets] entry in `hf_token` ([engine] for every "
            "pool)"
        ]
    return []


def _missing_secret(fleet: DeployFleet, token: str | None) -> list[str]:
    if token is None or token in fleet.secrets:
        return []
    known = ", ".join(fleet.secrets) or "none"
    return [
        f"secret {token!r} is not in the file's [secrets] (declared: {known}); add "
        f'`[secrets] {token} = {{ secretsmanager = "NAME" }}` or `{{ ssm = "/PARAMETER" }}`'
    ]


def memory_short(fleet: DeployFleet, ref: PoolRef, gpu: GpuSpec, model: ModelSpec) -> str | None:
    """Why the engine cannot start, when its GPUs cannot hold the weights and the KV cache
    of one whole sequence (vLLM refuses to start then); None when it fits."""
    pool, settings = ref.pool, fleet.engine_of(ref.pool)
    if settings.quantization is None:  # the checkpoint as it is
        weight_bytes = fleet.checkpoint_bytes(pool.models[0])
    else:
        weight_bytes = QUANTIZATION_BYTES.get(settings.quantization)
    if weight_bytes is not None:
        model = replace(model, weight_bytes=weight_bytes)
    utilisation = settings.gpu_memory_utilization or DEFAULT_MEMORY_UTILIZATION
    gpus = pool.gpus_per_engine
    context = settings.max_model_len or model.max_model_len or 8192
    if kv_capacity_tokens(gpu, model, gpus, utilisation) >= context:
        return None
    usable = usable_bytes(gpu, gpus, utilisation)
    weights = model.weight_total_bytes
    kv = model.kv_bytes_per_token * context
    held = f"{gpus} x {gpu.name}" if gpus > 1 else gpu.name
    fix = (
        "a larger tensor_parallel, quantization, a smaller max_model_len or a GPU with more memory"
    )
    return (
        f"{model.name} does not fit {held}: it needs {(weights + kv) / 1e9:.1f} GB (weights "
        f"{weights / 1e9:.1f} GB + KV cache for {context} tokens {kv / 1e9:.1f} GB) and "
        f"{held} hold {usable / 1e9:.1f} GB ({gpu.memory_gb:g} GB each x "
        f"gpu_memory_utilization {utilisation:g}): {(weights + kv - usable) / 1e9:.1f} GB "
        f"short; use {fix}"
    )


def _argument_problems(fleet: DeployFleet, ref: PoolRef) -> list[str]:
    """The engine's arguments as the engine's own parser would take them (fleet/engine_flags):
    the version's table, else (an image) its tag's; extra_args may not set what a key sets."""
    settings = fleet.engine_of(ref.pool)
    argv = engine_argv(fleet, ref.pool)
    tag = (settings.image or "").rpartition(":")[2].removeprefix("v")
    version = settings.version or (tag if "/" not in tag else "")
    rendered = len(argv) - len(settings.extra_args)
    return check_engine_args(settings.kind, version, argv, rendered=rendered)
