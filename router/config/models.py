"""The router's `[[models]]`: each served model's shape (what its priors are computed from)
and how clients reach it: aliases, a weighted split between versions, fallbacks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from gpuroute.router.core.model_routes import (
    ModelRoute,
    ModelRouteError,
    ModelRoutes,
    split_problem,
)
from pydantic import Field, ValidationInfo, field_validator, model_validator

from gpuroute.models import EXPLICIT_FIELDS, ModelShapeConfig, ModelSpec

ModelName = str
SHAPE_KEYS = ("shape", "config_json", *EXPLICIT_FIELDS)


class RouterModelConfig(ModelShapeConfig):
    """One `[[models]]` entry. Its shape keys (`shape`, `config_json` or the explicit
    fields) may be left out: a built-in shape of the same name is used, else the router's
    `model_shape`."""

    name: str = Field(min_length=1, max_length=256)
    aliases: list[str] = Field(default_factory=list)
    # versions served under this name, each a model name engines serve, with a percentage;
    # the weights add up to 100 (canary: {"m@v1" = 95, "m@v2" = 5})
    split: dict[str, float] = Field(default_factory=dict)
    # models to serve instead when this one cannot meet a request's SLO or has no healthy
    # backend, in order: a lighter one here first; the global tier then tries other regions
    fallback: list[str] = Field(default_factory=list)
    slo_class: str | None = None  # the default SLO class of requests for it

    @model_validator(mode="after")
    def _one_source(self) -> RouterModelConfig:  # replaces ModelShapeConfig's: keys optional
        """Its shape keys, when any are given, name exactly one source."""
        if self.has_shape:
            ModelShapeConfig._one_source(self)
        if self.config_json is not None:  # read now: a bad file fails the config, not a start
            try:
                self.spec(self.name, Path("."))
            except ValueError as exc:
                raise ValueError(f"config_json: {exc}") from None
        return self

    @field_validator("split")
    @classmethod
    def _weights_add_up(cls, split: dict[str, float]) -> dict[str, float]:
        problem = split_problem(tuple(split.items()))
        if problem is not None:
            raise ValueError(problem)
        return split

    @field_validator("config_json")
    @classmethod
    def _relative_to_the_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        base = (info.context or {}).get("config_dir")
        if value is None or base is None:
            return value
        return str((Path(base) / value).resolve())

    @property
    def has_shape(self) -> bool:
        """Its entry says its shape (else a built-in of its name or the default is used)."""
        return any(getattr(self, k) is not None for k in SHAPE_KEYS)

    def route(self) -> ModelRoute:
        return ModelRoute(self.name, tuple(self.split.items()), tuple(self.fallback))


def model_routes(models: Iterable[RouterModelConfig]) -> ModelRoutes:
    models = list(models)
    aliases = {alias: m.name for m in models for alias in m.aliases}
    return ModelRoutes((m.route() for m in models), aliases)


def check_models(models: list[RouterModelConfig], served: frozenset[str] | None) -> None:
    """The table is usable: names once, no alias loop or shadowed model, fallbacks and
    versions that exist (`served` by a static backend; None: discovered, so unknown yet).
    Errors name the key (`models[1].fallback[0]`)."""
    names = [m.name for m in models]
    for i, m in enumerate(models):
        if m.name in names[:i]:  # the second time it is listed
            raise ValueError(f"models[{i}].name: {m.name!r} is listed twice")
    aliases = _check_aliases(models, served)
    for i, m in enumerate(models):
        if served is not None:
            for version in m.split:
                if version not in served:
                    raise ValueError(
                        f"models[{i}].split: version {version!r} is served by no backend"
                    )
        _check_fallbacks(i, m, models, aliases, served)
    try:
        model_routes(models)
    except ModelRouteError as exc:
        raise ValueError(f"models: {exc}") from None


def _check_aliases(
    models: list[RouterModelConfig], served: frozenset[str] | None
) -> dict[str, str]:
    """Each alias names one model, makes no loop and shadows no model's name; the aliases,
    to their model."""
    names = {m.name for m in models}
    table = ModelRoutes()
    for i, m in enumerate(models):
        for j, alias in enumerate(m.aliases):
            if alias in table.aliases:
                raise ValueError(
                    f"models[{i}].aliases[{j}]: {alias!r} is an alias of "
                    f"{table.aliases[alias]!r} already"
                )
            table.aliases[alias] = m.name
    for i, m in enumerate(models):
        for j, alias in enumerate(m.aliases):
            try:
                table.alias_target(alias)
            except ModelRouteError as exc:
                raise ValueError(f"models[{i}].aliases[{j}]: {exc}") from None
            if alias in names or (served is not None and alias in served):
                raise ValueError(f"models[{i}].aliases[{j}]: {alias!r} is a model's own name")
    return table.aliases


def _check_fallbacks(
    i: int,
    m: RouterModelConfig,
    models: list[RouterModelConfig],
    aliases: Mapping[str, str],
    served: frozenset[str] | None,
) -> None:
    """`m`'s fallbacks name a model (or an alias of one) other than itself that a backend
    serves, itself or through its split's versions (when what is served is known)."""
    split = {n.name: n.split for n in models}
    known = set(split) | {v for n in models for v in n.split} | (served or set())
    for j, other in enumerate(m.fallback):
        target = aliases.get(other, other)
        if target not in known:
            raise ValueError(f"models[{i}].fallback[{j}]: unknown model {other!r}")
        if target == m.name:
            raise ValueError(f"models[{i}].fallback[{j}]: a model cannot fall back to itself")
        if served is not None and not split.get(target) and target not in served:
            raise ValueError(f"models[{i}].fallback[{j}]: {other!r} is served by no backend")


def shapes(
    models: Iterable[RouterModelConfig], default: str, builtins: Mapping[str, ModelSpec]
) -> dict[str, ModelSpec]:
    """Each served name's shape: its entry's, else a built-in of its name, else `default`;
    a split's versions run their model's shape unless they have an entry of their own."""
    out: dict[str, ModelSpec] = {}
    models = list(models)
    for m in models:
        if m.has_shape:
            out[m.name] = m.spec(m.name, Path("."))  # its config_json path is absolute
        else:
            out[m.name] = builtins.get(m.name, builtins[default])
    for m in models:
        for version in m.split:
            out.setdefault(version, out[m.name])
    return out


__all__ = ["ModelName", "RouterModelConfig", "check_models", "model_routes", "shapes"]
