"""The fleet file read whole: its `[[models]]` (the router's, with the weights engines load
and a per-model SLO), and what the checks a deployment needs beyond the file's own shape
read of it (fleet/checks.py: an instance for every pool, a model that fits its engine's
GPUs, secrets that exist, weights that are named). `check-config`, `tfvars`, `plan
--write-fleet` and `sim --fleet` share it, so nothing downstream (Terraform, a host's
engine) is the first to say no."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuroute.router.config.models import RouterModelConfig, check_models
from gpuroute.router.config.models import shapes as model_shapes
from pydantic import Field

from gpuroute.config import ConfigError, StrictModel, read_toml, validate
from gpuroute.models import DEFAULT_MODEL, MODELS, ModelSpec
from gpuroute.regions import EngineSettings, FleetConfig, GpuPool, Region

DEFAULT_VERSIONS = {"vllm": "0.32.0", "sglang": "0.5.6"}
IMAGES = {"vllm": "vllm/vllm-openai:v{version}", "sglang": "lmsysorg/sglang:v{version}"}
# the Hugging Face repositories of the built-in shapes (gpuroute/models.py cites them)
BUILTIN_WEIGHTS = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B-Instruct-FP8",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gemma-2-9b": "google/gemma-2-9b-it",
}
# bytes per weight of those repositories' checkpoints, where the built-in shape assumes fewer
# (served 8-bit, as the simulator runs them): an engine without --quantization loads these
CHECKPOINT_BYTES = {
    name: 2.0
    for name in (
        "llama-3.1-8b", "llama-3.2-3b", "llama-3.1-70b", "qwen2.5-7b", "qwen3-8b",
        "qwen3-30b-a3b", "mixtral-8x7b", "gemma-2-9b",
    )
}  # fmt: skip
# repositories whose licence must be accepted: a host needs a Hugging Face token for them
GATED_PREFIXES = ("meta-llama/", "google/gemma", "mistralai/")


class ModelSlo(StrictModel):
    """One model's SLO ("TTFT 2 s on the 70B"), for `plan` and `sim`."""

    ttft_s: float = Field(gt=0)
    tpot_s: float = Field(gt=0)


class FleetModelConfig(RouterModelConfig):
    """A fleet file's `[[models]]`: the router's entry, what engines load (a Hugging Face
    repository or a path on the host; built-in shapes default to theirs) and its SLO."""

    weights: str | None = Field(default=None, min_length=1, max_length=512)
    slo: ModelSlo | None = None


class DeployFleet(FleetConfig):
    """The fleet file with its [[models]] checked as the router checks them."""

    models: list[FleetModelConfig] = Field(default_factory=list)

    def model(self, name: str) -> FleetModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def shapes(self) -> dict[str, ModelSpec]:
        return MODELS | model_shapes(self.models, DEFAULT_MODEL, MODELS)

    def pools(self) -> Iterator[PoolRef]:
        for i, region in enumerate(self.regions):
            for j, pool in enumerate(region.gpu_pools):
                yield PoolRef(region, i, j, self.pool_name(region, j), pool)

    def engine_of(self, pool: GpuPool) -> EngineSettings:
        """The pool's engine settings over the fleet's, with the kind and version filled."""
        settings = pool.engine.over(self.engine)
        kind = settings.kind or "vllm"
        version = settings.version
        if settings.image is None and version is None:
            version = DEFAULT_VERSIONS[kind]
        return settings.model_copy(update={"kind": kind, "version": version})

    def image_of(self, pool: GpuPool) -> str:
        settings = self.engine_of(pool)
        if settings.image is not None:
            return settings.image
        return IMAGES[settings.kind].format(version=settings.version)

    def checkpoint_bytes(self, model: str) -> float | None:
        """Bytes per weight of what engines load for `model` without --quantization, where
        that is more than its shape says (a built-in shape's public 16-bit checkpoint)."""
        return checkpoint_bytes(self.model(model), model)

    def weights(self, model: str) -> str | None:
        return weights_for(self.model(model), model)


@dataclass(frozen=True, slots=True)
class PoolRef:
    """A pool with where it is: `key` ("regions[0].gpu_pools[1]") for messages, `name` its
    name in its region (Terraform's group is "<region>/<name>")."""

    region: Region
    region_index: int
    index: int
    name: str
    pool: GpuPool

    @property
    def key(self) -> str:
        return f"regions[{self.region_index}].gpu_pools[{self.index}]"


def weights_for(entry: RouterModelConfig | None, model: str) -> str | None:
    """What engines load for `model` (its [[models]] `entry`, if any): the entry's
    `weights`, else the public repository of the built-in shape it names or is."""
    own = getattr(entry, "weights", None)  # a scenario's entry may be the router's
    if own is not None:
        return own
    return BUILTIN_WEIGHTS.get(entry.shape if entry is not None and entry.shape else model)


def checkpoint_bytes(entry: RouterModelConfig | None, model: str) -> float | None:
    """A built-in shape's checkpoint bytes per weight when `model` (its [[models]] `entry`,
    if any) loads that shape's public checkpoint; None when its own figures or its own
    weights say what it loads."""
    shape = entry.shape if entry is not None and entry.shape else model
    if entry is not None:
        own_figures = entry.config_json is not None or (entry.has_shape and not entry.shape)
        own_weights = getattr(entry, "weights", None) not in (None, BUILTIN_WEIGHTS.get(shape))
        if own_figures or own_weights:
            return None
    return CHECKPOINT_BYTES.get(shape)


def read_deploy_fleet(path: Path | str) -> DeployFleet:
    """Read and validate a fleet file, its [[models]] as the router checks them; what
    deploying it needs is fleet/checks.py's `load_deploy_fleet`."""
    fleet = validate(path, read_toml(path), DeployFleet)
    try:
        check_models(fleet.models, frozenset(served_names(fleet)))
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return fleet


def served_names(fleet: DeployFleet) -> set[str]:
    """Every model name some pool's engines serve."""
    return {m for ref in fleet.pools() for m in ref.pool.models}
