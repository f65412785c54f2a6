"""`gpuroute check-config` (a fleet file, a router, global tier or agent config, or a
simulator scenario) and `gpuroute tfvars` (Terraform variables from the fleet file)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

KINDS = ("fleet", "router", "global", "agent", "scenario")
ALIASES = {"regions": "fleet"}  # a fleet file was called a regions file


def register(sub) -> None:
    check = sub.add_parser(
        "check-config",
        help="validate a config file (fleet, router, global tier, agent or scenario)",
    )
    check.add_argument("file", metavar="FILE")
    check.add_argument(
        "--kind",
        choices=(*KINDS, *ALIASES),
        default=None,
        help="what FILE is (default: told by its top-level keys); secrets in files are not read",
    )
    check.set_defaults(run=check_config)
    tfvars = sub.add_parser(
        "tfvars", help="Terraform variables (JSON) for deploy/terraform from a fleet file"
    )
    tfvars.add_argument("file", metavar="FILE")
    tfvars.set_defaults(run=tfvars_json)


def check_config(args: argparse.Namespace) -> int:
    from gpuroute.config import ConfigError, read_toml

    kind = ALIASES.get(args.kind, args.kind)
    try:
        if kind is None:
            kind = infer_kind(args.file, read_toml(args.file))
        summary = _check(kind, args.file)
    except ConfigError as exc:
        print(f"gpuroute check-config: error: {exc}", file=sys.stderr)
        if kind is not None and args.kind is None:
            print(f"(checked as a {_NAMES[kind]}, from its top-level keys; if it is "
                  "another kind, say so with --kind)", file=sys.stderr)  # fmt: skip
        return 2
    print(f"{args.file}: ok ({summary})")
    return 0


_NAMES = {
    "fleet": "fleet file",
    "scenario": "simulator scenario",
    "router": "router config",
    "global": "global tier config",
    "agent": "agent config",
}


def top_level_keys(kind: str) -> frozenset[str]:
    """The top-level keys a file of this kind may hold (its model's fields)."""
    from gpuroute.agent.config import AgentConfig
    from gpuroute.fleet.schema import DeployFleet
    from gpuroute.global_.config import GlobalConfig
    from gpuroute.router.config.router import RouterConfig
    from gpuroute.sim.scenario import Scenario

    model = {
        "fleet": DeployFleet,
        "scenario": Scenario,
        "router": RouterConfig,
        "global": GlobalConfig,
        "agent": AgentConfig,
    }[kind]
    return frozenset(model.model_fields)


def infer_kind(path: str, data: dict[str, Any]) -> str:
    """The kind whose top-level keys cover most of the file's (`backends` or `membership`
    make a router config, `engine` an agent's, `endpoints` or `spillover` a global tier's,
    `regions` a fleet file, `workload` a scenario). Every kind validates strictly, so a
    guess that is wrong would only print a wall of unknown keys; a tie is an error that
    says what to do."""
    from gpuroute.config import ConfigError

    keys = sorted(data)
    known = {kind: len(top_level_keys(kind).intersection(keys)) for kind in KINDS}
    best = max(known.values())
    winners = [kind for kind in KINDS if known[kind] == best]
    if best and len(winners) == 1:
        return winners[0]
    if not keys:
        why = "it has no top-level keys"
    elif not best:
        why = f"no kind has its top-level keys ({', '.join(keys)})"
    else:
        why = f"its top-level keys ({', '.join(keys)}) fit {' and '.join(winners)} equally"
    raise ConfigError(
        f"{path}: cannot tell which kind of config this is (considered {', '.join(KINDS)}): "
        f"{why}; name it with --kind {{{','.join(KINDS)}}}"
    )


def _check(kind: str, path: str) -> str:
    if kind == "router":
        from gpuroute.router.config.router import load_router_config

        router = load_router_config(path)
        return f"router config, policy {router.policy}, {len(router.auth.keys)} API keys"
    if kind == "global":
        from gpuroute.global_.config import load_global_config

        config, fleet, _rules = load_global_config(path)
        return f"global tier config, {len(fleet.regions)} regions, policy {config.policy}"
    if kind == "agent":
        from gpuroute.agent.config import load_agent_config

        return f"agent config, service {load_agent_config(path).service_id}"
    if kind == "scenario":
        return _check_scenario(path)
    from gpuroute.fleet.checks import load_deploy_fleet

    fleet = load_deploy_fleet(path)
    pools = list(fleet.pools())
    gpus = sum(ref.pool.count for ref in pools)
    engines = sum(ref.pool.engines for ref in pools)
    models = len({ref.pool.models[0] for ref in pools})
    return (
        f"fleet file, {_count(len(fleet.regions), 'region')}, {_count(len(pools), 'pool')}, "
        f"{gpus} GPUs in {engines} engines, {_count(models, 'model')}"
    )


def _check_scenario(path: str) -> str:
    from gpuroute.sim.scenario import load_scenario

    scenario = load_scenario(path).scenario
    return (
        f"simulator scenario, {scenario.name!r}: {scenario.engine_count} engines on "
        f"{scenario.gpu_count} GPUs, {_count(len(scenario.model_mix()), 'model')}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def tfvars_json(args: argparse.Namespace) -> int:
    from gpuroute.fleet.tfvars import render_tfvars

    sys.stdout.write(render_tfvars(args.file))
    return 0
