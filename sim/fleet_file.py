"""A fleet file as a scenario's engines: "a scenario is a fleet plus traffic".

`gpuroute sim --fleet FILE` and `gpuroute capacity --fleet FILE`, and a scenario's own
`fleet = "path.toml"`, replace the scenario's `[[gpus]]` with the fleet's pools: each pool
with engines is a group of `engines` = count / (tensor x pipeline parallel) engines of its
GPU type serving its first model (the weights its engines load; the other names are the
same engines), in its region. The fleet's `[[gpu_types]]` and `[[models]]` (their shapes,
fallbacks and per-model SLOs) come with them, ahead of the scenario's own of the same name.
Without a scenario the traffic comes from flags (`traffic_from_flags`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuroute.fleet.schema import DeployFleet, read_deploy_fleet

from gpuroute.config import ConfigError

FLEET_KEY = "fleet"
# what a simulated engine has no use for: names clients may use (requests name the model)
NOT_SIMULATED_MODEL_KEYS = ("aliases", "weights")


def load_fleet_for_sim(path: Path | str) -> DeployFleet:
    """The fleet file, validated (what deploying it needs is `check-config`'s question, not
    the simulator's: a fleet run by hand simulates as well)."""
    return read_deploy_fleet(path)


def pool_groups(fleet: DeployFleet) -> list[dict[str, Any]]:
    """The fleet's pools as a scenario's `[[gpus]]`, in file order; pools without an
    engine (count 0) are left out."""
    return [
        {
            "gpu": ref.pool.gpu,
            "count": ref.pool.engines,
            "model": ref.pool.models[0],
            "tensor_parallel": ref.pool.tensor_parallel,
            "pipeline_parallel": ref.pool.pipeline_parallel,
            "region": ref.region.name,
        }
        for ref in fleet.pools()
        if ref.pool.engines > 0
    ]


def gpu_shares(fleet: DeployFleet) -> dict[str, float]:
    """Each served model's share of the fleet's GPUs: the traffic mix when no scenario
    gives one (a model gets requests as it gets GPUs)."""
    gpus: dict[str, int] = {}
    for group in pool_groups(fleet):
        per_engine = group["tensor_parallel"] * group["pipeline_parallel"]
        gpus[group["model"]] = gpus.get(group["model"], 0) + group["count"] * per_engine
    total = sum(gpus.values())
    if not total:
        raise ConfigError("the fleet has no engine to simulate (every pool's count is 0)")
    return {model: n / total for model, n in gpus.items()}


def with_fleet(data: dict[str, Any], source: str, fleet_path: Path) -> dict[str, Any]:
    """A scenario's data with its engines, GPU types and models from the fleet file."""
    if "gpus" in data:
        raise ConfigError(
            f"{source}: gpus: the engines come from the fleet file ({fleet_path}); leave out "
            "[[gpus]] (or `fleet`)"
        )
    fleet = load_fleet_for_sim(fleet_path)
    types = [t.model_dump(exclude={"aws_instance_types"}, exclude_unset=True)
             for t in fleet.gpu_types]  # fmt: skip
    models = [
        m.model_dump(exclude=set(NOT_SIMULATED_MODEL_KEYS), exclude_unset=True)
        for m in fleet.models
    ]
    return data | {
        FLEET_KEY: str(fleet_path),
        "gpus": pool_groups(fleet),
        "gpu_types": types + _not_named(data.get("gpu_types", []), types),
        "models": models + _not_named(data.get("models", []), models),
    }


def _not_named(entries: list[dict[str, Any]], taken: list[dict[str, Any]]) -> list[dict]:
    names = {e.get("name") for e in taken}
    return [e for e in entries if not isinstance(e, dict) or e.get("name") not in names]


def fleet_path_of(data: dict[str, Any], base_dir: Path, fleet: str | Path | None) -> Path | None:
    """The fleet file a scenario runs: `--fleet` (relative to the working directory), else
    its own `fleet` key (relative to the scenario's directory), else none."""
    if fleet is not None:
        return Path(fleet)
    named = data.get(FLEET_KEY)
    if named is None:
        return None
    if not isinstance(named, str):
        raise ConfigError(f"{FLEET_KEY}: a path to a fleet file (TOML)")
    return base_dir / named


def traffic_from_flags(
    fleet_path: Path, *, profile: str, requests: int, rate_rps: float | None, seed: int
) -> dict[str, Any]:
    """A scenario's data for a fleet file alone: synthetic `profile` lengths, `requests`
    of them at `rate_rps` (else at 80 % of the fleet's capacity), the models' shares of
    requests as their shares of the fleet's GPUs."""
    mix = gpu_shares(load_fleet_for_sim(fleet_path))
    workload: dict[str, Any] = {
        "profile": profile,
        "max_requests": requests,
        "model": next(iter(mix)),
    }
    if len(mix) > 1:
        workload["models"] = mix
    if rate_rps is not None:
        workload["rate_rps"] = rate_rps
    else:
        workload["target_utilization"] = 0.8
    return {"name": fleet_path.stem, "seed": seed, "workload": workload}
