"""`gpuroute explain REQUEST_ID --config router.toml`: why a recent request went where it
went, or was refused, as the router's decision log kept it (`GET /admin/explain/{id}` on the
admin listener; the id is the answer's `x-request-id`)."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from gpuroute.router.admin.client import add_arguments, run_call


def register(sub) -> None:
    explain = sub.add_parser(
        "explain", help="why a recent request went where it went (the router's decision log)"
    )
    explain.add_argument(
        "request_id", metavar="REQUEST_ID",
        help="the answer's x-request-id (or a client's own id: every request sent with it)",
    )  # fmt: skip
    add_arguments(explain)
    explain.add_argument("--json", action="store_true", help="print the events as JSON")
    explain.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    path = f"/admin/explain/{quote(args.request_id, safe='')}"

    def show(body: dict) -> None:
        events = body["events"]
        print(json.dumps(events, indent=2) if args.json else describe(events))

    return run_call(args, "explain", ("GET", path, None), show)


def describe(events: list[dict[str, Any]]) -> str:
    """The events as an operator reads them: one paragraph each, oldest first."""
    return "\n\n".join(_describe_one(e) for e in events)


def _describe_one(event: dict[str, Any]) -> str:
    kind = event["event"]
    client = event.get("client_request_id")
    sent_as = f" sent as {client}" if client is not None else ""
    head = (
        f"{kind} (request {event['request_id']}{sent_as}, tenant {event.get('tenant')}, "
        f"model {event.get('model')}, SLO class {event.get('slo_class')})"
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
