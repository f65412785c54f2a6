"""AWS GPU instance types: which GPU each carries, how many, with how much memory, and the
choice of one for a pool. The same catalog file (aws_gpu_instances.json) is Terraform's
(deploy/terraform/modules/fleet-plan), so `check-config` refuses what `terraform plan`
would, before it runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

from gpuroute.gpus import GpuSpec
from gpuroute.regions import AwsInstanceType, FleetConfig, GpuPool

CATALOG_FILE = "aws_gpu_instances.json"


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    gpu: str
    gpus: int
    gpu_memory_gb: float | None = None  # None: the GPU type's own
    interconnect: str = "PCIe"
    interconnect_gbs: float | None = None
    instance_storage_gb: float = 0.0


@cache
def load_catalog() -> tuple[InstanceType, ...]:
    """The built-in catalog, in the order defaults are chosen."""
    text = (resources.files("gpuroute.fleet") / CATALOG_FILE).read_text()
    return tuple(InstanceType(**entry) for entry in json.loads(text)["instances"])


def catalog_by_name() -> dict[str, InstanceType]:
    return {i.name: i for i in load_catalog()}


def gpu_on(spec: GpuSpec, instance: InstanceType | None) -> GpuSpec:
    """The GPU as an instance carries it: p4d's A100s have 40 GB, the type's figures 80."""
    if instance is None or instance.gpu_memory_gb is None:
        return spec
    return replace(spec, memory_gb=min(spec.memory_gb, instance.gpu_memory_gb))


class NoInstance(ValueError):
    """A pool no instance type can carry; the message says why and what would."""


def instances_of(fleet: FleetConfig, gpu: str) -> list[InstanceType]:
    """The instance types that carry `gpu`: a declared type's `aws_instance_types`, else
    the catalog's."""
    by_name = catalog_by_name()
    for declared in fleet.gpu_types:
        if declared.name == gpu and declared.aws_instance_types is not None:
            return [
                _declared_instance(gpu, entry, by_name) for entry in declared.aws_instance_types
            ]
    return [i for i in load_catalog() if i.gpu == gpu]


def _declared_instance(
    gpu: str, entry: str | AwsInstanceType, by_name: dict[str, InstanceType]
) -> InstanceType:
    if isinstance(entry, AwsInstanceType):
        return InstanceType(
            entry.name, gpu, entry.gpus, instance_storage_gb=entry.instance_storage_gb
        )
    if entry not in by_name:
        raise NoInstance(
            f"aws_instance_types: {entry!r} is not in the catalog; give it as a table "
            f"{{ name = {entry!r}, gpus = N }}"
        )
    return replace(by_name[entry], gpu=gpu)  # the catalog's figures, carrying the declared type


def where_deployable(gpu: str) -> str:
    """Where a GPU type without an AWS instance can still go, said in one phrase."""
    return (
        f"declare the instance types that carry it under [[gpu_types]] name = {gpu!r} "
        "(aws_instance_types), or keep the pool out of `gpuroute tfvars` (count = 0) and run "
        "it where that GPU is: hosts you run yourself with `gpuroute agent` "
        '(docs/deploy.md, "Hosts outside AWS")'
    )


def instance_for(fleet: FleetConfig, pool: GpuPool) -> InstanceType:
    """The pool's instance type: its `instance_type`, else the first that carries its GPU
    with a whole number of its engines per host. NoInstance says why none fits."""
    offered = instances_of(fleet, pool.gpu)
    if not offered:
        families = sorted({i.gpu for i in load_catalog()})
        raise NoInstance(
            f"no AWS instance type carries GPU type {pool.gpu!r} (the catalog has "
            f"{', '.join(families)}); {where_deployable(pool.gpu)}"
        )
    per_engine = pool.gpus_per_engine
    if pool.instance_type is not None:
        chosen = next((i for i in offered if i.name == pool.instance_type), None)
        if chosen is None:
            raise NoInstance(
                f"instance_type {pool.instance_type!r} does not carry {pool.gpu}; those that "
                f"do: {', '.join(i.name for i in offered)}"
            )
        if chosen.gpus % per_engine:
            raise NoInstance(
                f"tensor_parallel x pipeline_parallel = {per_engine} GPUs per engine does not "
                f"divide {chosen.name}'s {chosen.gpus} GPUs"
            )
        return chosen
    for instance in offered:
        if instance.gpus % per_engine == 0:
            return instance
    sizes = sorted({i.gpus for i in offered})
    raise NoInstance(
        f"tensor_parallel x pipeline_parallel = {per_engine} GPUs per engine divides no "
        f"{pool.gpu} instance's GPUs ({', '.join(map(str, sizes))} per host); use a "
        "tensor_parallel that divides one"
    )
