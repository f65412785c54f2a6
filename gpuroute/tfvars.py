"""`gpuroute tfvars FILE`: the Terraform variables for deploy/terraform/examples/multi-region,
from the same regions file the software reads, so one file describes the fleet for both.

What Terraform cannot compute is computed here: each region's neighbours, nearest first, by
great-circle distance (Terraform has no trigonometry); defaults for AZs and CIDR indexes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gpuroute.config import ConfigError
from gpuroute.regions import FleetConfig, GpuPool, Location, load_fleet

EARTH_RADIUS_KM = 6371.0


def great_circle_km(a: Location, b: Location) -> float:
    """Haversine distance."""
    lat1, lon1, lat2, lon2 = map(math.radians, (a.lat, a.lon, b.lat, b.lon))
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h))


def fleet_tfvars(fleet: FleetConfig, path: Path | str) -> dict[str, Any]:
    """Variables for the multi-region example; ConfigError names the file and key."""
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
    indexes = [
        r.deploy.cidr_index if r.deploy.cidr_index is not None else i
        for i, r in enumerate(fleet.regions)
    ]
    if len(set(indexes)) != len(indexes):
        problems.append(f"{path}: regions[].deploy.cidr_index: two regions share a CIDR index")
    if problems:
        raise ConfigError("\n".join(problems))
    regions = {}
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
            "gpu_pools": [pool_tfvars(p) for p in region.gpu_pools],
        }
    return {"regions": regions, "global_regions": list(fleet.deploy.global_regions)}


def pool_tfvars(pool: GpuPool) -> dict[str, Any]:
    """A GPU pool as fleet-plan reads it; unset optional keys stay out (Terraform's defaults:
    bounds at the host count, no standby)."""
    out: dict[str, Any] = {"gpu": pool.gpu, "count": pool.count, "models": pool.models}
    optional = {
        "zone": pool.zone,
        "min_hosts": pool.min_hosts,
        "max_hosts": pool.max_hosts,
        "standby_hosts": pool.standby_hosts,
    }
    return out | {key: value for key, value in optional.items() if value}


def render_tfvars(path: Path | str) -> str:
    return json.dumps(fleet_tfvars(load_fleet(path), path), indent=2) + "\n"
