"""What the router did around injected faults, read from its decision log.

With `decision_log_sample = 1.0` the router logs every pick and every failed attempt with
a wall-clock timestamp; this lines them up with the moments the faults were applied."""

from __future__ import annotations

import json
from pathlib import Path

from gpuroute.bench.live_stats import q
from gpuroute.bench.loadgen import RequestResult
from gpuroute.testbed.processes import Child

BIN_S = 1.0
FAIR_WINDOW_S = 20.0


def read_events(log: Path) -> list[dict]:
    """The decision-log entries in a router's log, in either format (gpuroute/logs.py): a
    JSON line holds the entry as its `decision` field; a text line ends with
    `decision=` and the entry as JSON."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        if "gpuroute.decisions" not in line:
            continue
        try:
            if line.startswith("{"):
                event = json.loads(line).get("decision")
            else:
                event = json.loads(line[line.index(" decision={") + len(" decision=") :])
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def fault_report(
    log: Path, applied: list[dict], engines: list[tuple[str, Child]], results: list[RequestResult]
) -> list[dict]:
    events = read_events(log)
    picks = [(e["ts"], e["chosen"]) for e in events if e.get("event") == "decision"]
    failures = [(e["ts"], e["backend"]) for e in events if e.get("event") == "attempt_failed"]
    report = []
    for fault in applied:
        backend = f"127.0.0.1:{engines[fault['engine']][1].port}"
        at = fault["wall"]
        entry = {
            "kind": fault["kind"],
            "engine": fault["engine"],
            "backend": backend,
            "at_s": fault["applied_at_s"],
        }
        if fault["kind"] == "kill":
            first = min((t for t, b in failures if b == backend and t >= at - 1), default=None)
            entry["first_failure_after_s"] = None if first is None else round(first - at, 3)
            entry["picks_after_first_failure"] = (
                None if first is None else sum(1 for t, b in picks if b == backend and t > first)
            )
            entry |= streams_on_killed(results, backend, fault["applied_at_s"])
        else:
            before = [b for t, b in picks if at - FAIR_WINDOW_S <= t < at]
            fair = before.count(backend) / len(before) if before else 0.0
            shares = []
            for k in range(30):
                window = [b for t, b in picks if at + k * BIN_S <= t < at + (k + 1) * BIN_S]
                shares.append(round(window.count(backend) / len(window), 4) if window else None)
            below = next(
                (k + 1 for k, s in enumerate(shares) if s is not None and s < fair / 2), None
            )
            entry |= {
                "factor": fault["factor"],
                "share_before": round(fair, 4),
                "share_per_second_after": shares,
                "seconds_to_below_half_share": below,
            }
        report.append(entry)
    return report


def streams_on_killed(results: list[RequestResult], backend: str, at_s: float) -> dict:
    """The streams in flight on the killed engine when it died (their first bytes came from
    it, they were sent before and ended after): how many were lost, and the pause the
    others' clients saw (their longest silence between chunks: the continuation's)."""
    hit = [
        r for r in results
        if r.backend == backend and r.sent_at < at_s < r.sent_at + (r.e2e_s or 0.0)
    ]  # fmt: skip
    pauses = [r.max_gap_s for r in hit if r.ok]
    return {
        "streams_in_flight": len(hit),
        "streams_lost": sum(1 for r in hit if not r.ok),
        "pause_p50_s": q(pauses, 50) if pauses else None,
        "pause_p99_s": q(pauses, 99) if pauses else None,
    }


async def continuation_stats(router_url: str) -> dict:
    """What continuations cost, from the router's /metrics: streams continued, and the
    prompt tokens prefilled again for them against all the prompt tokens engines reported
    (gpuroute_tokens_total), as a share of the run's prefill."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(router_url + "/metrics") as r:
        text = await r.text()
    continued = prefill = prompt = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpuroute_stream_continuations_total":
                continued += sample.value if sample.labels["outcome"] == "continued" else 0
            elif sample.name == "gpuroute_stream_continuation_prefill_tokens_total":
                prefill += sample.value
            elif sample.name == "gpuroute_tokens_total" and sample.labels["direction"] == "prompt":
                prompt += sample.value
    share = prefill / (prompt + prefill) if prompt + prefill else 0.0
    return {"continued": int(continued), "reprefill_tokens": int(prefill),
            "reprefill_share": round(share, 5)}  # fmt: skip
