"""`gpuroute check-config` and `gpuroute tfvars`: the fleet file (regions.example.toml)."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    check = sub.add_parser("check-config", help="validate a regions file")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(run=check_config)
    tfvars = sub.add_parser(
        "tfvars", help="Terraform variables (JSON) for deploy/terraform from a regions file"
    )
    tfvars.add_argument("file", metavar="FILE")
    tfvars.set_defaults(run=tfvars_json)


def check_config(args: argparse.Namespace) -> int:
    from gpuroute.regions import load_fleet

    fleet = load_fleet(args.file)
    gpus = sum(p.count for r in fleet.regions for p in r.gpu_pools)
    print(f"{args.file}: ok ({len(fleet.regions)} regions, {gpus} GPUs)")
    return 0


def tfvars_json(args: argparse.Namespace) -> int:
    from gpuroute.tfvars import render_tfvars

    sys.stdout.write(render_tfvars(args.file))
    return 0
