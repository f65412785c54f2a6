"""`gpuroute usage --since 7d [--until ...] [--tenant T] [--model M] [--json]`: per-tenant
requests and tokens from a router's usage records (`GET /admin/usage` on its admin
listener: with Redis, any one replica answers for all of them)."""

from __future__ import annotations

import argparse
from urllib.parse import urlencode

from gpuroute.router.admin.client import add_arguments, run_call
from gpuroute.router.admin.show import as_json

COLUMNS = (
    ("requests", "requests"),
    ("errors", "errors"),
    ("prompt_tokens", "prompt tokens"),
    ("completion_tokens", "completion tokens"),
)


def register(sub) -> None:
    usage = sub.add_parser(
        "usage", help="per-tenant requests and tokens for billing (a router's usage records)"
    )
    usage.add_argument(
        "--since", required=True, help="ISO 8601 (2026-11-01T00:00:00Z, UTC unless it says) "
        "or a time ago (90m, 24h, 7d, 2w); rounded down to its hour",
    )  # fmt: skip
    usage.add_argument("--until", help="as --since, rounded up to its hour (default: now)")
    usage.add_argument("--tenant", help="only this tenant (its name, as in auth.keys)")
    usage.add_argument("--model", help="only this model (the one that served the requests)")
    usage.add_argument("--json", action="store_true", help="print the router's JSON answer")
    add_arguments(usage)  # the admin listener and its token, as `gpuroute admin` finds them
    usage.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    query = {"since": args.since, "until": args.until, "tenant": args.tenant, "model": args.model}
    params = urlencode({k: v for k, v in query.items() if v is not None})
    show = (lambda body: print(as_json(body))) if args.json else print_usage
    return run_call(args, "usage", ("GET", f"/admin/usage?{params}", None), show)


def print_usage(body: dict) -> None:
    """One row per tenant and model, each tenant's sum under its models, then the total."""
    from rich.table import Table
    from rich.text import Text

    from gpuroute.console.tables import stdout_console

    scope = "all replicas (Redis)" if body.get("shared") else "this replica only (no Redis)"
    table = Table(title=f"Usage {body['since']} to {body['until']}, {scope}", title_justify="left")
    table.add_column("tenant")
    table.add_column("model")
    for _, header in COLUMNS:
        table.add_column(header, justify="right")

    def cells(counts: dict) -> list[str]:
        return [f"{counts.get(key, 0):,}" for key, _ in COLUMNS]

    for tenant, sums in body["tenants"].items():
        models = list(sums["models"].items())
        for model, counts in models:
            table.add_row(Text(tenant), Text(model), *cells(counts), end_section=len(models) == 1)
        if len(models) > 1:
            table.add_row(Text(tenant), Text("all", style="italic"), *cells(sums), end_section=True)
    table.add_row(Text("total", style="bold"), "", *cells(body["total"]))
    stdout_console().print(table)
