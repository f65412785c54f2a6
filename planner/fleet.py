"""`gpuroute plan --write-fleet FILE`: the recommended fleet as a fleet file, the one that
`check-config` checks, `sim --fleet` simulates and `tfvars` renders.

One region, a pool per model and GPU option: `count` GPUs = engines x tensor parallel,
rounded up to whole hosts of the pool's AWS instance type where the GPU type has one (the
first in the catalog holding whole engines with the GPU's full memory, written out as
`instance_type`), so the fleet written can have more engines than the plan: it is run as
written at the peak and its own figures reported. The scenario's declared `[[gpu_types]]`
and the planned models' `[[models]]` entries (shapes, fallbacks, per-model SLOs) go with it.
No deploy key is written but the region's `deploy.aws_region`, and that only when given."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from gpuroute.fleet.instances import InstanceType, gpu_on, load_catalog
from gpuroute.fleet.schema import GATED_PREFIXES, checkpoint_bytes, weights_for
from gpuroute.planner.check import GpuOption
from gpuroute.planner.plan import FleetPlan, Judged, Planner

from gpuroute.gpus import GpuCatalog
from gpuroute.roofline import kv_capacity_tokens

# the region written: edit its name and place to deploy elsewhere (docs/deploy.md)
REGION = {
    "name": "us-east",
    "city": "Washington DC",
    "jurisdiction": "us",
    "location": {"lat": 38.9, "lon": -77.0},
}


HF_SECRET = "hf-token"  # the [secrets] name of the Hugging Face token, for gated weights


@dataclass(frozen=True, slots=True)
class WrittenPool:
    name: str
    model: str
    option: GpuOption
    planned: int  # engines the plan asked for
    engines: int  # engines written (whole hosts)
    instance: InstanceType | None
    max_model_len: int | None = None  # set where the model's own context does not fit
    # simulated with a built-in shape's 8-bit weights while its public checkpoint is 16-bit:
    # written with quantization = "fp8", so engines serve what was simulated
    serve_fp8: bool = False

    @property
    def gpus(self) -> int:
        return self.engines * self.option.tp

    @property
    def hosts(self) -> int | None:
        return None if self.instance is None else self.gpus // self.instance.gpus


@dataclass(slots=True)
class WrittenFleet:
    path: str
    pools: list[WrittenPool]
    cost_per_hour: float
    judged: Judged  # the fleet as written, run at the peak

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "pools": [
                {
                    "name": p.name,
                    "model": p.model,
                    "gpu": p.option.gpu,
                    "count": p.gpus,
                    "tensor_parallel": p.option.tp,
                    "engines": p.engines,
                    "planned": p.planned,
                    "instance_type": p.instance.name if p.instance else None,
                    "hosts": p.hosts,
                }
                for p in self.pools
            ],
            "cost_per_hour": self.cost_per_hour,
            "attainment": self.judged.attainment,
            "pool_attainment": self.judged.pools,
            "misses": self.judged.misses,
            "meets": self.judged.meets,
        }


def host_of(option: GpuOption, catalog: GpuCatalog) -> InstanceType | None:
    """The catalog's instance for engines of `option`: the first holding whole engines whose
    GPUs have the type's full memory (the plan's figures assume it), else the first holding
    whole engines; None where no AWS instance carries the type."""
    whole = [i for i in load_catalog() if i.gpu == option.gpu and i.gpus % option.tp == 0]
    memory = catalog[option.gpu].memory_gb
    full = [i for i in whole if i.gpu_memory_gb is None or i.gpu_memory_gb >= memory]
    return (full or whole or [None])[0]


def written_pools(plan: FleetPlan, planner: Planner) -> list[WrittenPool]:
    """Each planned pool and option, rounded up to whole hosts."""
    catalog = planner.scenario.gpu_catalog()
    pools: list[WrittenPool] = []
    names: set[str] = set()
    for pool in plan.pools:
        for option in planner.options_for(pool.model):
            planned = pool.backends.get(option.label, 0)
            if not planned:
                continue
            host = host_of(option, catalog)
            engines = planned
            if host is not None:
                per_host = host.gpus // option.tp
                engines = math.ceil(planned / per_host) * per_host
            name = _pool_name(pool.model, option, names)
            context = context_that_fits(planner, pool.model, option, host)
            entry = next((m for m in planner.scenario.models if m.name == pool.model), None)
            fp8 = checkpoint_bytes(entry, pool.model) is not None
            pools.append(
                WrittenPool(name, pool.model, option, planned, engines, host, context, fp8)
            )
    return pools


def context_that_fits(
    planner: Planner, model: str, option: GpuOption, host: InstanceType | None
) -> int | None:
    """The `max_model_len` to write where an engine's GPUs cannot hold the KV cache of one
    whole sequence of the model's own context (vLLM would not start; check-config says so):
    the longest context that fits, in thousands of tokens, at least the workload's longest
    request. None where the model's own fits."""
    spec = planner.scenario.shapes()[model]
    gpu = gpu_on(planner.scenario.gpu_catalog()[option.gpu], host)
    room = kv_capacity_tokens(gpu, spec, option.tp)
    if room >= (spec.max_model_len or 8192):
        return None
    longest = int((planner.workload.prompts + planner.workload.outputs).max())
    return max(room // 1024 * 1024, longest)


def _pool_name(model: str, option: GpuOption, taken: set[str]) -> str:
    """`llama-3-1-70b-h200-tp4`: the fleet file's pool name pattern, unique in the region."""
    base = re.sub(r"[^a-z0-9]+", "-", f"{model}-{option.label}".lower()).strip("-")[:36]
    name, k = base, 2
    while name in taken:
        name, k = f"{base}-{k}", k + 1
    taken.add(name)
    return name


def fleet_document(
    planner: Planner, pools: list[WrittenPool], aws_region: str | None
) -> dict[str, Any]:
    """The fleet file's content."""
    scenario = planner.scenario
    served = {p.model for p in pools}
    entries = {m.name: m for m in scenario.models}
    models = []
    for name in dict.fromkeys(p.model for p in pools):
        entry = entries.get(name)
        doc = {"name": name}
        if entry is not None:
            doc |= entry.model_dump(exclude_defaults=True, exclude={"name"})
            doc["fallback"] = [f for f in entry.fallback if f in served]
            doc = {k: v for k, v in doc.items() if v not in ([], None)}
        models.append(doc)
    region: dict[str, Any] = dict(REGION)
    if aws_region is not None:
        region["deploy"] = {"aws_region": aws_region}
    region["gpu_pools"] = [_pool_doc(p) for p in pools]
    gated = [n for n in served if (weights_for(entries.get(n), n) or "").startswith(GATED_PREFIXES)]
    secrets: dict[str, Any] = {}
    if gated:  # hosts read the Hugging Face token from Secrets Manager (docs/deploy.md)
        secrets = {
            "secrets": {HF_SECRET: {"secretsmanager": f"gpuroute/{HF_SECRET}"}},
            "engine": {"hf_token": HF_SECRET},
        }
    return secrets | {
        "gpu_types": [t.model_dump(exclude_defaults=True) for t in scenario.gpu_types],
        "models": models,
        "regions": [region],
    }


def _pool_doc(pool: WrittenPool) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": pool.name, "gpu": pool.option.gpu, "count": pool.gpus}
    doc["models"] = [pool.model]
    if pool.option.tp > 1:
        doc["tensor_parallel"] = pool.option.tp
    if pool.instance is not None:
        doc["instance_type"] = pool.instance.name
    engine: dict[str, Any] = {}
    if pool.max_model_len is not None:
        engine["max_model_len"] = pool.max_model_len
    if pool.serve_fp8:
        engine["quantization"] = "fp8"
    if engine:
        doc["engine"] = engine
    return doc


def write_fleet(
    plan: FleetPlan, planner: Planner, path: str, aws_region: str | None
) -> WrittenFleet:
    """Write the plan's fleet to `path` and run it as written at the peak."""
    pools = written_pools(plan, planner)
    document = fleet_document(planner, pools, aws_region)
    header = (
        f"# Written by `gpuroute plan` for scenario {plan.scenario!r} at {plan.peak_rps:g} "
        f"req/s, {plan.attainment_target:.0%} of requests within their SLO.\n"
        "# Check it with `gpuroute check-config`; simulate it with `gpuroute sim --fleet`.\n"
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(header + tomli_w.dumps(document))
    chosen: dict[str, dict[GpuOption, int]] = {}
    for pool in pools:
        chosen.setdefault(pool.model, {})[pool.option] = pool.engines
    cost = sum(p.option.price_per_hour * p.engines for p in pools)
    return WrittenFleet(path, pools, round(cost, 4), planner.judge(chosen, plan.peak_rps))
