"""`gpuroute usage --since 7d [--until ...] [--tenant T] [--model M] [--json]`: per-tenant
requests and tokens from a router's usage records (`GET /admin/usage` on its admin
listener: with Redis, any one replica answers for all of them)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

from gpuroute.router.explain_cli import admin_target, error_message

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
    usage.add_argument("--config", metavar="FILE", help="the router's TOML: admin listener, token")
    usage.add_argument(
        "--url", "--admin-url", dest="admin_url", metavar="URL",
        help="a router's admin listener, http://HOST:PORT (instead of --config)",
    )  # fmt: skip
    usage.add_argument("--token-file", metavar="FILE", help="a file holding the admin token")
    usage.add_argument(
        "--token-env", metavar="NAME", help="an environment variable holding the admin token"
    )
    usage.set_defaults(run=_run)


def admin_token(args: argparse.Namespace, fallback: str | None) -> str | None:
    """--token-file, else --token-env, else the config's token or $GPUROUTE_ADMIN_TOKEN."""
    if args.token_file is not None:
        return Path(args.token_file).read_text().strip()
    if args.token_env is not None:
        if (token := os.environ.get(args.token_env)) is None:
            raise SystemExit(f"gpuroute usage: ${args.token_env} is not set")
        return token
    return fallback


def _run(args: argparse.Namespace) -> int:
    url, token = admin_target(args, "usage")
    token = admin_token(args, token)
    query = {"since": args.since, "until": args.until, "tenant": args.tenant, "model": args.model}
    params = urlencode({k: v for k, v in query.items() if v is not None})
    request = urllib.request.Request(f"{url}/admin/usage?{params}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as exc:
        print(f"gpuroute usage: {exc.code}: {error_message(exc)}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"gpuroute usage: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body, indent=2, ensure_ascii=False))
    else:
        print_usage(body)
    return 0


def print_usage(body: dict) -> None:
    """One row per tenant and model, each tenant's sum under its models, then the total."""
    from rich.table import Table
    from rich.text import Text

    from gpuroute.reporting import stdout_console

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
        for i, (model, counts) in enumerate(models):
            last = i == len(models) - 1 and len(models) == 1
            table.add_row(Text(tenant), Text(model), *cells(counts), end_section=last)
        if len(models) > 1:
            table.add_row(Text(tenant), Text("all", style="italic"), *cells(sums), end_section=True)
    table.add_row(Text("total", style="bold"), "", *cells(body["total"]))
    stdout_console().print(table)
