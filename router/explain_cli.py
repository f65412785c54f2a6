"""`gpuroute explain REQUEST_ID --config router.toml`: why a recent request went where it
went, or was refused, as the router's decision log kept it (`GET /admin/explain/{id}` on the
admin listener; the id is the answer's `x-request-id`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

TOKEN_ENV = "GPUROUTE_ADMIN_TOKEN"


def register(sub) -> None:
    explain = sub.add_parser(
        "explain", help="why a recent request went where it went (the router's decision log)"
    )
    explain.add_argument("request_id", metavar="REQUEST_ID", help="the answer's x-request-id")
    explain.add_argument(
        "--config", metavar="FILE", help="the router's TOML: its admin listener and token"
    )
    explain.add_argument(
        "--admin-url", metavar="URL", help="the router's admin listener (instead of --config)"
    )
    explain.add_argument("--json", action="store_true", help="print the events as JSON")
    explain.set_defaults(run=_run)


def admin_target(args: argparse.Namespace, command: str = "explain") -> tuple[str, str | None]:
    """The admin listener's URL and the admin token (config first, then $GPUROUTE_ADMIN_TOKEN)."""
    token = os.environ.get(TOKEN_ENV)
    if args.config is None:
        if args.admin_url is None:
            raise SystemExit(f"gpuroute {command}: give --config ROUTER_TOML or --admin-url URL")
        return args.admin_url.rstrip("/"), token
    from gpuroute.router.config import load_router_config

    from gpuroute.secrets import read_secret

    config = load_router_config(args.config)
    listen = config.listen if config.admin_on_public_listener else config.admin_listen
    scheme = "https" if listen.tls is not None else "http"
    host = "127.0.0.1" if listen.host in ("0.0.0.0", "::", "") else listen.host
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    url = args.admin_url or f"{scheme}://{host}:{listen.port}"
    return url.rstrip("/"), read_secret(config, "admin_token", "router") or token


def _run(args: argparse.Namespace) -> int:
    url, token = admin_target(args)
    request = urllib.request.Request(f"{url}/admin/explain/{quote(args.request_id, safe='')}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as exc:
        print(f"gpuroute explain: {exc.code}: {error_message(exc)}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"gpuroute explain: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    events = body["events"]
    print(json.dumps(events, indent=2) if args.json else describe(events))
    return 0


def error_message(exc: urllib.error.HTTPError) -> str:
    """The OpenAI-format error's message, or the HTTP reason when the body is not one."""
    try:
        error = json.loads(exc.read() or b"{}").get("error")
    except (ValueError, AttributeError):
        error = None
    return error.get("message", exc.reason) if isinstance(error, dict) else str(exc.reason)


def describe(events: list[dict[str, Any]]) -> str:
    """The events as an operator reads them: one paragraph each, oldest first."""
    return "\n\n".join(_describe_one(e) for e in events)


def _describe_one(event: dict[str, Any]) -> str:
    kind = event["event"]
    head = f"{kind} (request {event['request_id']}, model {event.get('model')}, " + (
        f"SLO class {event.get('slo_class')})"
    )
    if kind == "refused":
        return f"{head}\n  answered {event['status']} {event['code']}: {event['why']}"
    if kind == "attempt_failed":
        return f"{head}\n  {event['backend']} failed: {event['kind']}"
    if kind == "held":
        return f"{head}\n  {event['why']}"
    if kind == "no_candidate":
        return f"{head}\n" + _excluded(event["excluded"])
    lines = [
        f"{head}, attempt {event['attempt']}",
        f"  chose {event['chosen']} ({event['chosen_gpu']}), reason: {event['reason']}, "
        f"fits SLO: {event['fits_slo']}, margin needed: {event.get('margin_needed')}",
        f"  candidates: {event.get('candidates_n')}, sampled: {event.get('sampled', 'all')}",
    ]
    if event.get("excluded"):
        lines.append(_excluded(event["excluded"]))
    for row in event.get("candidates", []):
        details = ", ".join(f"{k}={v}" for k, v in row.items() if k != "backend")
        lines.append(f"    {row['backend']}: {details}")
    return "\n".join(lines)


def _excluded(excluded: dict[str, str]) -> str:
    if not excluded:
        return "  no backend serves the model"
    return "\n".join(f"  not a candidate: {b}: {why}" for b, why in excluded.items())
