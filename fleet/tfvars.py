"""`gpuroute tfvars FILE`: the Terraform variables for deploy/terraform/examples/multi-region,
from the same fleet file the software reads, so one file describes the fleet for both.

What Terraform cannot compute is computed here: each region's neighbours, nearest first, by
great-circle distance (Terraform has no trigonometry); defaults for AZs and CIDR indexes.
What the hosts need from the rest of the file comes along: the routers' [[models]] (a
`config_json` travels as its text, which the router hosts write next to their config) and
the declared [[gpu_types]] (without their AWS instances, which only Terraform's plan reads)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gpuroute.fleet.checks import load_deploy_fleet
from gpuroute.fleet.engine_args import engine_argv
from gpuroute.fleet.instances import instance_for
from gpuroute.fleet.schema import DeployFleet, FleetModelConfig, PoolRef
from gpuroute.router.core.slo import DEFAULT_SLO_CLASSES

from gpuroute.config import ConfigError
from gpuroute.regions import Location

EARTH_RADIUS_KM = 6371.0


def great_circle_km(a: Location, b: Location) -> float:
    """Haversine distance."""
    lat1, lon1, lat2, lon2 = map(math.radians, (a.lat, a.lon, b.lat, b.lon))
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h))


def deploy_problems(fleet: DeployFleet, path: Path | str) -> list[str]:
    """What Terraform's rollout needs beyond a valid fleet file, each as `file: key: message`."""
    problems = []
    for i, r in enumerate(fleet.regions):
        if r.deploy.aws_region is None:
            problems.append(f"{path}: regions[{i}].deploy.aws_region: needed by gpuroute tfvars")
    names = [r.name for r in fleet.regions]
    for name in fleet.deploy.global_regions:
        if name not in names:
            problems.append(f"{path}: deploy.global_regions: unknown region {name!r}")
    if len(set(fleet.deploy.global_regions)) < 2:
        problems.append(
            f"{path}: deploy.global_regions: name at least two regions for the global tier"
        )
    indexes = cidr_indexes(fleet)
    if len(set(indexes)) != len(indexes):
        problems.append(f"{path}: regions[].deploy.cidr_index: two regions share a CIDR index")
    known = [c.name for c in DEFAULT_SLO_CLASSES]  # the routers Terraform writes set no [slo]
    for i, m in enumerate(fleet.models):
        if m.slo_class is not None and m.slo_class not in known:
            problems.append(
                f"{path}: models[{i}].slo_class: {m.slo_class!r} is not a class the deployed "
                f"routers have ({', '.join(known)})"
            )
    return problems


def cidr_indexes(fleet: DeployFleet) -> list[int]:
    """Each region's /16 index: its `deploy.cidr_index`, else its position in the file."""
    return [
        r.deploy.cidr_index if r.deploy.cidr_index is not None else i
        for i, r in enumerate(fleet.regions)
    ]


def fleet_tfvars(fleet: DeployFleet, path: Path | str) -> dict[str, Any]:
    """Variables for the multi-region example; ConfigError names the file and key."""
    problems = deploy_problems(fleet, path)
    if problems:
        raise ConfigError("\n".join(problems))
    indexes = cidr_indexes(fleet)
    regions = {}
    refs = list(fleet.pools())
    for region, index in zip(fleet.regions, indexes, strict=True):
        d = region.deploy
        others = sorted(
            (o for o in fleet.regions if o.name != region.name),
            key=lambda o: (great_circle_km(region.location, o.location), o.name),
        )
        regions[region.name] = {
            "aws_region": d.aws_region,
            "cidr_index": index,
            "jurisdiction": region.jurisdiction,
            "azs": d.azs or [f"{d.aws_region}{z}" for z in "abc"],
            "federate": d.federate,
            "neighbours": [o.name for o in others],
            "gpu_pools": [pool_tfvars(fleet, ref) for ref in refs if ref.region is region],
        }
    return {
        "regions": regions,
        "global_regions": list(fleet.deploy.global_regions),
        "models": [router_model(m) for m in fleet.models],
        "gpu_types": [
            t.model_dump(exclude={"aws_instance_types"}, exclude_none=True) for t in fleet.gpu_types
        ],
    }


def router_model(model: FleetModelConfig) -> dict[str, Any]:
    """A [[models]] entry as the regional routers read it: the fleet-only keys (weights, slo)
    left out, and a `config_json` replaced by the file's JSON (`config_json_text`), because
    the path is this machine's; modules/region writes it on each router host and points
    `config_json` at it, so the routers read the very shape the fleet file names."""
    out = model.model_dump(exclude={"weights", "slo", "config_json"}, exclude_defaults=True)
    if model.config_json is not None:  # absolute: resolved against the fleet file's folder
        text = Path(model.config_json).read_text()
        out["config_json_text"] = json.dumps(json.loads(text), separators=(",", ":"))
    return out


def pool_tfvars(fleet: DeployFleet, ref: PoolRef) -> dict[str, Any]:
    """A GPU pool as fleet-plan reads it: its instance type, how many GPUs each host has and
    the engine each runs; unset optional keys stay out (Terraform's defaults: bounds at the
    host count, no standby)."""
    pool = ref.pool
    out: dict[str, Any] = {
        "name": ref.name, "gpu": pool.gpu, "count": pool.count, "models": pool.models,
        "tensor_parallel": pool.tensor_parallel, "pipeline_parallel": pool.pipeline_parallel,
    }  # fmt: skip
    if pool.count > 0:
        instance = instance_for(fleet, pool)
        out |= {"instance_type": instance.name, "gpus_per_host": instance.gpus}
    settings = fleet.engine_of(pool)
    secret = fleet.secrets.get(settings.hf_token) if settings.hf_token else None
    out["engine"] = {
        "kind": settings.kind,
        "image": fleet.image_of(pool),
        "args": engine_argv(fleet, pool),
        "hf_token": None if secret is None else {"source": secret.source, "name": secret.name},
    }
    optional = {
        "zone": pool.zone,
        "capacity_weight": pool.capacity_weight,
        "min_hosts": pool.min_hosts,
        "max_hosts": pool.max_hosts,
        "standby_hosts": pool.standby_hosts,
    }
    return out | {key: value for key, value in optional.items() if value}


def render_tfvars(path: Path | str) -> str:
    return json.dumps(fleet_tfvars(load_deploy_fleet(path), path), indent=2) + "\n"
