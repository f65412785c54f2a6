"""`gpuroute fake-engine --specs FILE`: GPU types and model shapes beyond the built-ins,
read from any TOML file that declares them (a scenario, a router config).

Only its `[[gpu_types]]` and `[[models]]` tables are read, validated with the classes the
router and the simulator use (gpuroute/gpus.py GpuTypeConfig, router/config/models.py
RouterModelConfig), so an engine started from a scenario runs exactly the GPU and shape that
the scenario's simulation and its router's priors assume. Errors name the file and the key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuroute.router.config.models import RouterModelConfig
from gpuroute.router.config.models import shapes as model_shapes
from pydantic import Field, field_validator

from gpuroute.config import ConfigError, read_toml, validate
from gpuroute.gpus import DeclaresGpuTypes, GpuCatalog, GpuSpec
from gpuroute.models import DEFAULT_MODEL, MODELS, ModelSpec

SPEC_TABLES = ("gpu_types", "models")


class EngineSpecsFile(DeclaresGpuTypes):
    """The two tables of a specs file (the rest of the file is not read)."""

    models: list[RouterModelConfig] = Field(default_factory=list)

    @field_validator("models")
    @classmethod
    def _each_once(cls, models: list[RouterModelConfig]) -> list[RouterModelConfig]:
        names = [m.name for m in models]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise ValueError(f"model {name!r} is listed twice")
        return models


@dataclass(frozen=True)
class EngineSpecs:
    """GPU types and model shapes an engine may run: the built-ins plus a file's."""

    gpus: GpuCatalog
    shapes: dict[str, ModelSpec]
    source: str | None = None  # the specs file; None: the built-ins alone

    @property
    def where(self) -> str:
        return "a file given as --specs" if self.source is None else self.source

    def gpu(self, name: str) -> GpuSpec:
        """A GPU type; ValueError listing the known ones and saying where to declare one."""
        if name not in self.gpus:
            raise ValueError(
                f"--gpu: unknown GPU type {name!r}; known: {', '.join(self.gpus)}; declare it "
                f"under [[gpu_types]] in {self.where}"
            )
        return self.gpus[name]

    def model(self, name: str) -> ModelSpec:
        """A model shape by its name; ValueError listing the known ones."""
        if name not in self.shapes:
            raise ValueError(
                f"--model: unknown model shape {name!r}; known: {', '.join(self.shapes)}; "
                f"declare it under [[models]] in {self.where}"
            )
        return self.shapes[name]


BUILTIN_SPECS = EngineSpecs(GpuCatalog(), dict(MODELS))


def load_engine_specs(path: Path | str) -> EngineSpecs:
    """The built-ins plus `path`'s [[gpu_types]] and [[models]] (a [[models]] entry without
    shape keys runs the built-in of its name, else the default shape, as in the router and
    the simulator). ConfigError naming the file and key for anything invalid."""
    data = read_toml(path)
    tables = {key: data[key] for key in SPEC_TABLES if key in data}
    if not tables:
        raise ConfigError(f"{path}: declares no [[gpu_types]] and no [[models]]")
    specs = validate(path, tables, EngineSpecsFile)
    try:
        declared = model_shapes(specs.models, DEFAULT_MODEL, MODELS)
    except ValueError as exc:  # a config_json that cannot be read
        raise ConfigError(f"{path}: models: {exc}") from None
    return EngineSpecs(specs.gpu_catalog(), MODELS | declared, str(path))
