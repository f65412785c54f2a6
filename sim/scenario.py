"""Scenario files for `gpuroute sim`: TOML, validated, with errors naming the file and key."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from gpuroute.fleet.schema import FleetModelConfig
from gpuroute.router.config.models import check_models
from gpuroute.router.config.models import shapes as model_shapes
from gpuroute.router.config.rebalance import RebalanceConfig
from gpuroute.router.config.router import GpuPrices, SloClassConfig
from gpuroute.router.core.policies import (
    OlderKey,
    check_policy_table,
    resolve_policy_name,
    settings_table,
)
from gpuroute.router.core.slo import DEFAULT_SLO_CLASS, SloClass
from gpuroute.sim.adapters import LoraSection
from gpuroute.sim.daily import DailySection
from gpuroute.sim.fleet_file import fleet_path_of, traffic_from_flags, with_fleet
from gpuroute.sim.global_scenario import GlobalSection
from gpuroute.sim.scaling import ScenarioAutoscale
from gpuroute.sim.traces import TRACE_FORMATS
from gpuroute.sim.workloads import PROFILES
from pydantic import AfterValidator, AliasChoices, Field, field_validator, model_validator

from gpuroute.config import ConfigError, StrictModel, known_name, read_toml, validate
from gpuroute.continuation.text import ContinuationConfig
from gpuroute.gpus import DeclaresGpuTypes, GpuTypeName
from gpuroute.models import DEFAULT_MODEL, MODELS, ModelSpec
from gpuroute.roofline import EngineKind, EngineParams

BUILTIN_DEFAULT = "demo"


class WorkloadSection(StrictModel):
    trace: str | None = None
    format: Literal["azure", "mooncake", "lengths"] | None = None
    profile: Annotated[str, AfterValidator(lambda v: known_name(v, PROFILES, "profile"))] | None = (
        None
    )
    target_utilization: float | None = Field(default=None, gt=0, le=3.0)
    rate_scale: float | None = Field(default=None, gt=0)
    rate_rps: float | None = Field(default=None, gt=0)
    max_requests: int | None = Field(default=None, ge=1, le=50_000_000)
    model: str = DEFAULT_MODEL  # a built-in shape or a [[models]] name
    # several models' traffic: model -> share of requests (adding up to 1); `model` names
    # the default one (the engines of a [[gpus]] group without `model` serve it)
    models: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=dict)
    # the rate moves through a day (its peak is the rate above), with flash crowds on top
    daily: DailySection | None = None

    @model_validator(mode="after")
    def one_source_one_rate(self) -> WorkloadSection:
        if (self.trace is None) == (self.profile is None):
            raise ValueError("set exactly one of `trace` (with `format`) or `profile`")
        if self.trace is not None and self.format is None:
            raise ValueError(
                f"`format` is required with `trace` (one of {', '.join(TRACE_FORMATS)})"
            )
        if self.profile is not None and self.max_requests is None and self.daily is None:
            raise ValueError("`max_requests` is required with `profile` (or a `daily` span)")
        spanned = self.daily is not None and self.profile is not None
        if spanned and not self.max_requests and self.rate_rps is None:
            raise ValueError("a `daily` profile without `max_requests` needs `rate_rps`")
        rates = [
            n
            for n in ("target_utilization", "rate_scale", "rate_rps")
            if getattr(self, n) is not None
        ]
        if len(rates) != 1:
            raise ValueError(
                "set exactly one of `target_utilization`, `rate_scale` (traces) or `rate_rps`"
                f" (profiles); got {rates or 'none'}"
            )
        if self.rate_scale is not None and self.trace is None:
            raise ValueError("`rate_scale` applies to traces; use `rate_rps` with a profile")
        if self.rate_rps is not None and self.profile is None:
            raise ValueError("`rate_rps` applies to profiles; use `rate_scale` with a trace")
        return self


class GpuGroup(StrictModel):
    """`count` engines of one GPU type, each spanning tensor × pipeline parallel GPUs and
    serving one model (the workload's `model` by default). The type's key is `gpu`, as in a
    fleet file's pools and a router's backends; `type`, its old name, still reads."""

    type: GpuTypeName = Field(validation_alias=AliasChoices("gpu", "type"))
    count: int = Field(ge=1, le=100_000)
    region: str | None = None
    model: str | None = None
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    pipeline_parallel: int = Field(default=1, ge=1, le=64)

    def kind(self, default_model: str) -> EngineKind:
        return EngineKind(
            self.type, self.model or default_model, self.tensor_parallel, self.pipeline_parallel
        )


class SloClassSpec(SloClassConfig):
    """A router's SLO class (router/config/router.py) with its share of the scenario's traffic."""

    share: float = Field(gt=0, le=1, description="fraction of requests in this class")


class SloSection(StrictModel):
    """One SLO for every request (`ttft_s`, `tpot_s`), or `[[slo.classes]]` with shares of
    traffic, most important first (they replace the single one)."""

    ttft_s: float = Field(default=2.0, gt=0)
    tpot_s: float = Field(default=0.1, gt=0)
    classes: list[SloClassSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def shares_add_up(self) -> SloSection:
        if self.classes:
            total = sum(c.share for c in self.classes)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"slo.classes shares must add up to 1, got {total:g}")
            if len({c.name for c in self.classes}) != len(self.classes):
                raise ValueError("slo.classes names must be distinct")
        return self

    def slo_classes(self) -> list[SloClass]:
        if not self.classes:
            return [SloClass(DEFAULT_SLO_CLASS, self.ttft_s, self.tpot_s)]
        return [c.slo_class() for c in self.classes]

    def shares(self) -> list[float]:
        return [c.share for c in self.classes] if self.classes else [1.0]


class RouterSection(StrictModel):
    policies: list[str] = Field(
        default_factory=lambda: ["round_robin", "least_connections", "least_outstanding_work"]
    )
    full_scan_max: int = Field(default=64, ge=1)
    choices: int = Field(default=4, ge=2)
    health_tick_s: float = Field(default=1.0, gt=0)
    # an upper bound, not a router setting: the cost model is told each request's true
    # output length, as if every client sent an exact max_tokens
    oracle_output_lengths: bool = False
    # predicting policies hold or refuse a request predicted to miss its SLO everywhere
    slo_admission: bool = True
    gpu_prices: GpuPrices = Field(default_factory=dict)
    cost_weight: float = Field(default=0.1, ge=0)
    slo_margin: float = Field(default=0.9, gt=0, le=1)
    # each policy's settings table, `[router.policy_settings.<name>]`: the router's
    # `[policy_settings.<name>]` (docs/configuration.md)
    policy_settings: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # the live router's retry.rescue_slowness: an attempt still waiting for its first token
    # moves off a backend this many times slower than the fleet (0: never)
    rescue_slowness: float = Field(default=10.0, ge=0)
    # time streams' paces as the live watch does; off by default: the engine model's
    # prefill-heavy steps read busy healthy GPUs as several times slow (docs/simulator.md)
    stream_paces: bool = False
    # the live router's backends[].max_inflight, for every backend: beyond it requests wait
    # in the admission queue (router/core/admission.py); None: no limit, all go at once
    max_inflight: int | None = Field(default=None, ge=1)

    @field_validator("policies")
    @classmethod
    def known_policies(cls, value: list[str]) -> list[str]:
        for name in value:
            resolve_policy_name(name)
        if not value:
            raise ValueError("at least one policy")
        return value

    def check_policy_settings(self) -> None:
        """Each `[router.policy_settings.<name>]` holds settings its policy takes, each
        set once (there, or under its older key): ValueError naming the key."""
        for name, table in self.policy_settings.items():
            check_policy_table(name, table, "router.policy_settings")
            self.policy_table(name)  # a setting set twice (there, and under its older key)

    def _older_policy_keys(self, name: str) -> dict[str, OlderKey]:
        """The settings of policy `name` that [router] keys older than `policy_settings`
        give (each setting's older key is its own name but `slo_margin`)."""
        if name == "slo_aware":
            older = {"cost_weight": "cost_weight", "margin": "slo_margin"}
        elif name in ("least_outstanding_work", "prefix_affinity"):
            older = {"full_scan_max": "full_scan_max", "choices": "choices"}
        else:
            return {}
        named = self.model_fields_set
        return {
            setting: OlderKey(f"router.{key}", getattr(self, key), key in named)
            for setting, key in older.items()
        }

    def policy_table(self, name: str) -> dict[str, object]:
        """The settings table policy `name` (or `default`) is built with: its
        `policy_settings` table over what older keys say of it."""
        name = resolve_policy_name(name)
        table = self.policy_settings.get(name, {})
        return settings_table(name, table, self._older_policy_keys(name), "router.policy_settings")


class Fault(StrictModel):
    at_s: float = Field(ge=0)
    kind: Literal["crash", "recover", "slow"]
    gpu: int = Field(ge=0, description="index into the expanded [[gpus]] list")
    factor: float = Field(default=1.0, gt=0, description="slowdown factor for kind=slow")


class Scenario(DeclaresGpuTypes):
    name: str = "scenario"
    seed: int = 0
    workload: WorkloadSection
    gpus: list[GpuGroup] = Field(min_length=1)
    # shapes of models beyond the built-ins, their fallbacks and per-model SLOs (a fleet
    # file's [[models]])
    models: list[FleetModelConfig] = Field(default_factory=list)
    slo: SloSection = SloSection()
    router: RouterSection = RouterSection()
    faults: list[Fault] = Field(default_factory=list)
    # the live router's [continuation]: a stream whose engine breaks mid-answer goes on
    # elsewhere (enabled, max_attempts; max_recorded_bytes is not simulated)
    continuation: ContinuationConfig = ContinuationConfig()
    # the router's [rebalance]: streams predicted to miss their TPOT move (off by default)
    rebalance: RebalanceConfig = RebalanceConfig()
    # pools that grow and shrink (sim/scaling.py): the router's [autoscale] plus boot times
    autoscale: ScenarioAutoscale = ScenarioAutoscale()
    prefix_caching: bool = True
    chunked_prefill: bool = True
    lora: LoraSection | None = None  # LoRA adapters (sim/adapters.py)
    global_: GlobalSection | None = Field(default=None, alias="global")
    # a fleet file whose pools are the [[gpus]] (sim/fleet_file.py): a fleet plus traffic
    fleet: str | None = None

    @property
    def gpu_count(self) -> int:
        return sum(g.count * g.tensor_parallel * g.pipeline_parallel for g in self.gpus)

    @property
    def engine_count(self) -> int:
        return sum(g.count for g in self.gpus)

    def shapes(self) -> dict[str, ModelSpec]:
        """Every model name the scenario may use, with its shape."""
        return MODELS | model_shapes(self.models, DEFAULT_MODEL, MODELS)

    def model_mix(self) -> dict[str, float]:
        return dict(self.workload.models) or {self.workload.model: 1.0}

    def slo_classes(self) -> list[SloClass]:
        """The [slo] classes, then one per model with its own `slo`, named after the model
        (ranked after the [slo] ones): every request for that model is in it."""
        own = [SloClass(m.name, m.slo.ttft_s, m.slo.tpot_s) for m in self.models if m.slo]
        return self.slo.slo_classes() + own

    def model_classes(self) -> dict[str, int]:
        """Each model with its own SLO: the index of its class in `slo_classes()`."""
        first = len(self.slo.slo_classes())
        return {m.name: first + k for k, m in enumerate(m for m in self.models if m.slo)}

    def classes_of(self, model: str) -> tuple[list[SloClass], list[float]]:
        """The SLO classes a model's requests are in, with their shares of them."""
        own = self.model_classes().get(model)
        if own is not None:
            return [self.slo_classes()[own]], [1.0]
        return self.slo.slo_classes(), self.slo.shares()

    @model_validator(mode="after")
    def _policy_settings(self) -> Scenario:
        self.router.check_policy_settings()  # errors name `router.policy_settings.<key>`
        return self

    @model_validator(mode="after")
    def _moves_need_continuation(self) -> Scenario:
        if self.rebalance.enabled and not self.continuation.enabled:
            raise ValueError(
                "rebalance.enabled needs continuation.enabled: a move is a continuation"
            )
        return self

    @model_validator(mode="after")
    def models_known_and_served(self) -> Scenario:
        for i, m in enumerate(self.models):
            for key in ("aliases", "split", "slo_class"):
                if getattr(m, key):
                    raise ValueError(f"models[{i}].{key}: not simulated (use it in a router)")
        known = self.shapes()
        mix = self.model_mix()
        if abs(sum(mix.values()) - 1.0) > 1e-6:
            raise ValueError(f"workload.models: shares add up to {sum(mix.values()):g}, not 1")
        served = {g.model or self.workload.model for g in self.gpus}
        named = [("workload.model", self.workload.model)]
        named += [(f"workload.models.{m}", m) for m in mix]
        named += [(f"gpus[{i}].model", g.model) for i, g in enumerate(self.gpus) if g.model]
        for key, name in named:
            if name not in known:
                raise ValueError(f"{key}: unknown model {name!r}; declare it under [[models]]")
        for model in mix:
            if model not in served:
                raise ValueError(f"workload.models.{model}: no [[gpus]] group serves it")
        check_models(self.models, frozenset(served))
        classes = {c.name for c in self.slo.slo_classes()}
        for i, m in enumerate(self.models):
            if m.slo is not None and m.name in classes:
                raise ValueError(
                    f"models[{i}].slo: its class is named after the model, {m.name!r}, "
                    "which is also an [slo] class; rename that class"
                )
        return self

    @model_validator(mode="after")
    def models_fit_their_gpus(self) -> Scenario:
        """Each group's model fits in its GPUs' memory with room for a KV cache (said here,
        naming the group, rather than deep in a run)."""
        for i, group in enumerate(self.gpus):
            try:
                self.engine_params(group.kind(self.workload.model))
            except ValueError as exc:
                raise ValueError(
                    f"gpus[{i}]: {exc}; use a smaller model, or more GPUs per engine "
                    "(tensor_parallel)"
                ) from None
        return self

    def engine_params(self, kind: EngineKind) -> EngineParams:
        """The roofline engine of one engine kind here; ValueError when its model does
        not fit."""
        return EngineParams(
            self.gpu_catalog()[kind.gpu], self.shapes()[kind.model], tp=kind.tp, pp=kind.pp,
            chunked_prefill=self.chunked_prefill, name=kind.key(self.workload.model),
        )  # fmt: skip

    @model_validator(mode="after")
    def gpus_in_known_regions(self) -> Scenario:
        if self.global_ is not None:
            names = {r.name for r in self.global_.regions}
            for i, g in enumerate(self.gpus):
                if g.region not in names:
                    raise ValueError(f"gpus[{i}].region {g.region!r} is not a [[global.regions]]")
        return self

    @model_validator(mode="after")
    def faults_in_range(self) -> Scenario:
        for fault in self.faults:
            if fault.gpu >= self.engine_count:
                raise ValueError(
                    f"fault gpu index {fault.gpu} >= number of engines {self.engine_count}"
                )
        return self


class LoadedScenario:
    """A validated scenario plus the directory its relative trace path is resolved against."""

    def __init__(self, scenario: Scenario, base_dir: Path, source: str) -> None:
        self.scenario = scenario
        self.base_dir = base_dir
        self.source = source

    def trace_path(self) -> Path | None:
        trace = self.scenario.workload.trace
        return None if trace is None else (self.base_dir / trace).resolve()


def load_scenario(path: Path | str, fleet: Path | str | None = None) -> LoadedScenario:
    """A scenario file; its engines from a fleet file where it names one (`fleet`) or where
    `fleet` is given (`--fleet`: the file's own [[gpus]] are replaced)."""
    path = Path(path)
    data = read_toml(path)
    if fleet is not None:
        data.pop("gpus", None)
    fleet_path = fleet_path_of(data, path.parent, fleet)
    if fleet_path is not None:
        data = with_fleet(data, str(path), fleet_path)
    scenario = validate(path, data, Scenario)
    return LoadedScenario(scenario, path.parent, str(path))


def fleet_scenario(fleet: Path | str, **traffic: Any) -> LoadedScenario:
    """A fleet file with traffic from flags (sim/fleet_file.py traffic_from_flags)."""
    path = Path(fleet)
    data = with_fleet(traffic_from_flags(path, **traffic), str(path), path)
    scenario = validate(path, data, Scenario)
    return LoadedScenario(scenario, Path.cwd(), str(path))


def builtin_scenario(
    name: str = BUILTIN_DEFAULT, fleet: Path | str | None = None
) -> LoadedScenario:
    """A scenario shipped in sim/scenarios (the synthetic ones need no data files)."""
    resource = resources.files("gpuroute.sim") / "scenarios" / f"{name}.toml"
    if not resource.is_file():
        folder = resources.files("gpuroute.sim") / "scenarios"
        known = sorted(
            f.name.removesuffix(".toml") for f in folder.iterdir() if f.name.endswith(".toml")
        )
        raise ConfigError(f"no built-in scenario named {name!r}; known: {', '.join(known)}")
    with resources.as_file(resource) as path:
        return load_scenario(path, fleet)
