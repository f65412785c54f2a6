"""`gpuroute check-config` (a regions file, or a router, global or agent config) and
`gpuroute tfvars` (Terraform variables from the regions file)."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    check = sub.add_parser("check-config", help="validate a regions file or a tier's config")
    check.add_argument("file", metavar="FILE")
    check.add_argument(
        "--kind",
        choices=["regions", "router", "global", "agent"],
        default="regions",
        help="what FILE is (default: a regions file); secrets in files are not read",
    )
    check.set_defaults(run=check_config)
    tfvars = sub.add_parser(
        "tfvars", help="Terraform variables (JSON) for deploy/terraform from a regions file"
    )
    tfvars.add_argument("file", metavar="FILE")
    tfvars.set_defaults(run=tfvars_json)


def check_config(args: argparse.Namespace) -> int:
    from gpuroute.config import ConfigError

    try:
        summary = _check(args.kind, args.file)
    except ConfigError as exc:
        print(f"gpuroute check-config: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.file}: ok ({summary})")
    return 0


def _check(kind: str, path: str) -> str:
    if kind == "router":
        from gpuroute.router.config import load_router_config

        router = load_router_config(path)
        return f"router, policy {router.policy}, {len(router.auth.keys)} API keys"
    if kind == "global":
        from gpuroute.global_.config import load_global_config

        config, fleet, _rules = load_global_config(path)
        return f"global tier, {len(fleet.regions)} regions, policy {config.policy}"
    if kind == "agent":
        from gpuroute.agent.config import load_agent_config

        return f"agent {load_agent_config(path).service_id}"
    from gpuroute.regions import load_fleet

    fleet = load_fleet(path)
    gpus = sum(p.count for r in fleet.regions for p in r.gpu_pools)
    return f"{len(fleet.regions)} regions, {gpus} GPUs"


def tfvars_json(args: argparse.Namespace) -> int:
    from gpuroute.tfvars import render_tfvars

    sys.stdout.write(render_tfvars(args.file))
    return 0
