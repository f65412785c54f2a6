"""The fleet file (`regions.example.toml`, `fleet.example.toml`): regions, where they are,
their jurisdiction and GPU pools, with the engines each pool runs. The global tier
(`regions_file`) reads its geography here; `gpuroute tfvars`, `plan`, `sim --fleet` and
`check-config` read the whole file through gpuroute.fleet (models, weights, instances,
engine arguments); regional routers do not read it (their `[region]` says where they are)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gpuroute.config import StrictModel, load_toml_model
from gpuroute.gpus import DeclaresGpuTypes, GpuTypeConfig, GpuTypeName

RegionName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{1,31}$")]
Jurisdiction = Annotated[str, Field(pattern=r"^[a-z]{2,8}$")]


class Location(StrictModel):
    lat: float = Field(ge=-90, le=90)
    lon: float = Field(ge=-180, le=180)


EngineKindName = Literal["vllm", "sglang"]
SecretName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
PoolName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]


class EngineSettings(StrictModel):
    """How a pool's engines run (`[engine]` for every pool, `[regions.gpu_pools.engine]` for
    one, key by key over it). Read by `gpuroute tfvars` (the command line each host starts)
    and checked by `check-config`; None: the fleet's default, else the engine's own."""

    kind: EngineKindName | None = None
    version: str | None = Field(default=None, pattern=r"^[0-9][0-9A-Za-z.+-]{0,31}$")
    image: str | None = Field(default=None, min_length=1, max_length=256)
    max_model_len: int | None = Field(default=None, ge=16, le=10_000_000)
    quantization: str | None = Field(default=None, pattern=r"^[a-z0-9_-]{1,32}$")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    lora_modules: dict[str, str] = Field(default_factory=dict)  # adapter name -> weights
    extra_args: list[str] = Field(default_factory=list)
    hf_token: SecretName | None = None  # a [secrets] name: the Hugging Face token

    @model_validator(mode="after")
    def _version_or_image(self) -> EngineSettings:
        if self.version is not None and self.image is not None:
            raise ValueError("set `version` or `image`, not both (an image names its version)")
        return self

    def over(self, base: EngineSettings) -> EngineSettings:
        """These settings over `base`, key by key (a pool's over the fleet's)."""
        mine = self.model_dump(exclude_unset=True)
        if mine.get("kind", base.kind) != (base.kind or "vllm"):  # not the base's release
            mine.setdefault("version", None)
        if "version" in mine:
            mine.setdefault("image", None)
        if "image" in mine:
            mine.setdefault("version", None)
        return base.model_copy(update=mine)


class SecretRef(StrictModel):
    """Where hosts read a secret when they need it (never in user data or the file)."""

    secretsmanager: str | None = Field(default=None, min_length=1, max_length=2048)
    ssm: str | None = Field(default=None, pattern=r"^(/[A-Za-z0-9_.\-/]+|arn:.+)$")

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.secretsmanager is None) == (self.ssm is None):
            raise ValueError("name exactly one of `secretsmanager` or `ssm`")
        return self

    @property
    def source(self) -> str:
        return "secretsmanager" if self.secretsmanager is not None else "ssm"

    @property
    def name(self) -> str:
        return self.secretsmanager or self.ssm or ""


class AwsInstanceType(StrictModel):
    """An instance type a declared GPU type runs on that the built-in catalog lacks."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
    gpus: int = Field(ge=1, le=64)
    instance_storage_gb: float = Field(default=0, ge=0)


class FleetGpuType(GpuTypeConfig):
    """A `[[gpu_types]]` entry of a fleet file: the figures, and the AWS instance types that
    carry it (catalog names, or tables for types the catalog lacks). None: the catalog's
    instances of that GPU, if any."""

    aws_instance_types: list[str | AwsInstanceType] | None = None


class GpuPool(StrictModel):
    """A group of identical GPU hosts in one region serving the same models.

    The `*_hosts` keys size the pool's auto-scaling group in hosts (`gpuroute tfvars` only):
    `count` in whole hosts is its size at creation, and the bounds default to it. Checks that
    need the host count (the GPU's instance type) are Terraform's.

    A pool that scales follows the routers' `gpuroute_pool_desired_backends{pool}`, where the
    pool is a model: the backends that model should have in rotation in the region. So it
    serves exactly one model, and no other pool of its region serves that model
    (FleetConfig), or two groups would each grow to the model's whole pool."""

    name: PoolName | None = None  # default: "<gpu, lower case>-<index in the region>"
    gpu: GpuTypeName
    count: int = Field(ge=0, le=100_000)  # GPUs; hosts are this over GPUs per instance
    models: list[str] = Field(min_length=1)  # served names: the first is the weights loaded
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    pipeline_parallel: int = Field(default=1, ge=1, le=64)
    instance_type: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
    engine: EngineSettings = EngineSettings()
    zone: str | None = None
    capacity_weight: float | None = Field(default=None, gt=0)
    min_hosts: int | None = Field(default=None, ge=1)  # the policy cannot scale out from zero
    max_hosts: int | None = Field(default=None, ge=1)
    standby_hosts: int = Field(default=0, ge=0)  # warm hosts, ready to join the group

    @property
    def gpus_per_engine(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def engines(self) -> int:
        return self.count // self.gpus_per_engine

    @property
    def autoscales(self) -> bool:
        """Whether the pool asks for a group that scales: standby hosts, or bounds other than
        min_hosts = max_hosts. Without the host count (Terraform's) a single bound counts, as
        a bound equal to the host count would be no use."""
        if self.standby_hosts:
            return True
        if self.min_hosts is None and self.max_hosts is None:
            return False
        return self.min_hosts != self.max_hosts

    @model_validator(mode="after")
    def bounds_in_order(self) -> GpuPool:
        low, high, standby = self.min_hosts, self.max_hosts, self.standby_hosts
        if low is None and high is None and standby:
            raise ValueError(
                "standby_hosts needs min_hosts or max_hosts: without them the group stays at "
                "its host count and never grows"
            )
        if low is not None and high is not None:
            if low > high:
                raise ValueError(f"min_hosts ({low}) is above max_hosts ({high})")
            if standby > high - low:
                raise ValueError(
                    f"standby_hosts ({standby}) is more than the group can grow by "
                    f"(max_hosts - min_hosts = {high - low}): those hosts would never serve"
                )
        if self.count % self.gpus_per_engine:
            raise ValueError(
                f"count ({self.count} GPUs) is not a whole number of engines of "
                f"tensor_parallel x pipeline_parallel = {self.gpus_per_engine} GPUs"
            )
        if self.autoscales and len(set(self.models)) != 1:
            raise ValueError(
                f"a pool that scales (min_hosts, max_hosts or standby_hosts) serves exactly one "
                f"model, the pool of the routers' desired backends it follows; it serves "
                f"{self.models}"
            )
        return self


AwsRegion = Annotated[str, Field(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$")]


class RegionDeploy(StrictModel):
    """Where Terraform puts the region (read by `gpuroute tfvars` only)."""

    aws_region: AwsRegion | None = None
    azs: list[str] | None = Field(default=None, min_length=3)  # default: <aws_region>a, b, c
    cidr_index: int | None = Field(default=None, ge=0, le=63)  # default: position in the file
    federate: bool = True  # WAN-join the other regions' Consul servers


class Region(StrictModel):
    name: RegionName
    location: Location
    jurisdiction: Jurisdiction
    city: str | None = None
    gpu_pools: list[GpuPool] = Field(default_factory=list)
    deploy: RegionDeploy = RegionDeploy()


class FleetDeploy(StrictModel):
    global_regions: list[RegionName] = Field(default_factory=list)  # run the global tier here


class FleetConfig(DeclaresGpuTypes):
    """The whole fleet file. Its `[[models]]` are checked by gpuroute.fleet (they are the
    router's [[models]], a tier above this kernel); the global tier reads the geography."""

    gpu_types: list[FleetGpuType] = Field(default_factory=list)
    regions: list[Region] = Field(min_length=1)
    deploy: FleetDeploy = FleetDeploy()
    engine: EngineSettings = EngineSettings()
    secrets: dict[SecretName, SecretRef] = Field(default_factory=dict)
    models: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def pool_names_unique(self) -> FleetConfig:
        for i, region in enumerate(self.regions):
            seen: dict[str, int] = {}
            for j, _pool in enumerate(region.gpu_pools):
                name = self.pool_name(region, j)
                if name in seen:
                    raise ValueError(
                        f"regions[{i}].gpu_pools[{j}]: pool name {name!r} is also "
                        f"regions[{i}].gpu_pools[{seen[name]}]'s; name them apart (`name`)"
                    )
                seen[name] = j
        return self

    @staticmethod
    def pool_name(region: Region, index: int) -> str:
        pool = region.gpu_pools[index]
        return pool.name or f"{pool.gpu.lower()}-{index}"

    @field_validator("regions")
    @classmethod
    def unique_region_names(cls, regions: list[Region]) -> list[Region]:
        seen: set[str] = set()
        for region in regions:
            if region.name in seen:
                raise ValueError(f"region name {region.name!r} appears twice")
            seen.add(region.name)
        return regions

    @model_validator(mode="after")
    def one_pool_per_scaled_model(self) -> FleetConfig:
        """No other pool of its region serves the model of a pool that scales: each group
        would follow the routers' desired backends for the model's whole pool. Pools of
        count 0 get no group (fleet-plan), so they do not count."""
        for i, region in enumerate(self.regions):
            pools = [(j, p) for j, p in enumerate(region.gpu_pools) if p.count > 0]
            for j, pool in pools:
                if not pool.autoscales:
                    continue
                for k, other in pools:
                    shared = [m for m in pool.models if m in other.models]
                    if k != j and shared:
                        raise ValueError(
                            f"regions[{i}].gpu_pools[{j}]: a pool that scales is the only "
                            f"pool of its region serving its model, but "
                            f"regions[{i}].gpu_pools[{k}] also serves {shared[0]!r} (each "
                            f"group would follow the routers' desired backends for the "
                            f"model's whole pool)"
                        )
        return self

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise KeyError(name)


def load_fleet(path: Path | str) -> FleetConfig:
    """Load and validate a regions file; raises ConfigError naming the file and key."""
    return load_toml_model(path, FleetConfig)
