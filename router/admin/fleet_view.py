"""What the router's admin listener shows of its fleet (`GET /admin/backends`).

With `?prompt_tokens=N&output_tokens=M` each backend also carries what the latency model
predicts now for such a request there (TTFT, TPOT, end to end): why a placement that
looks lopsided is the one that meets the SLO (the demo shows it beside each share). Off
unless asked, since it costs a prediction per backend on every call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from gpuroute.router.backends.membership import Membership
from gpuroute.router.config.router import RouterConfig
from gpuroute.router.core.backend import Backend
from gpuroute.router.core.scheduler import Scheduler

MAX_TOKENS = 10_000_000


class TypicalRequest(NamedTuple):
    """The request size `/admin/backends` predicts for."""

    prompt_tokens: int
    output_tokens: int


DEFAULT_TYPICAL = TypicalRequest(prompt_tokens=512, output_tokens=128)


def typical_request(query: Mapping[str, str]) -> TypicalRequest | None:
    """The request to predict for, from the query (None: none asked for); a missing one of
    the two takes its default. Raises ValueError naming a bad parameter (answered 400)."""
    if "prompt_tokens" not in query and "output_tokens" not in query:
        return None
    sizes = DEFAULT_TYPICAL._asdict()
    for name in sizes:
        if name in query:
            text = query[name]
            if not text.isdigit() or not 1 <= int(text) <= MAX_TOKENS:
                raise ValueError(f"{name}: expected a whole number from 1 to {MAX_TOKENS}")
            sizes[name] = int(text)
    return TypicalRequest(**sizes)


def describe_backends(
    scheduler: Scheduler,
    config: RouterConfig,
    membership: Membership | None,
    now: float,
    typical: TypicalRequest | None = None,
) -> dict:
    """Each backend's state as the scheduler sees it, and the membership's freshness."""
    rows = []
    for backend in scheduler.backends:
        row = _row(scheduler, backend)
        if typical is not None:
            row["predicted"] = _predicted(scheduler, backend, typical, now)
        if membership is not None and (extra := membership.describe(backend.backend_id)):
            row.update(extra)
        rows.append(row)
    body: dict = {"policy": config.policy, "backends": rows}
    if typical is not None:
        body["predicted_for"] = _predicted_for(config, typical)
    if membership is not None:
        body["membership"] = {
            "consul": config.membership.consul,
            "stale": membership.stale,
            "members": len(membership.members),
            "since_sync_s": None
            if membership.last_sync is None
            else round(now - membership.last_sync, 3),
        }
    return body


def _predicted(
    scheduler: Scheduler, backend: Backend, typical: TypicalRequest, now: float
) -> dict | None:
    """The latency model's prediction for the typical request there, if sent now (no
    prefix hit assumed); what an SLO-aware pick compares against the SLO."""
    latency = scheduler.latency
    if latency is None:
        return None
    prompt, output = typical
    p = latency.predict(backend, prompt, prompt, output, now)
    e2e = p.ttft_s + p.tpot_s * max(output - 1, 0)
    return {"ttft_s": round(p.ttft_s, 4), "tpot_s": round(p.tpot_s, 5), "e2e_s": round(e2e, 4)}


def _predicted_for(config: RouterConfig, typical: TypicalRequest) -> dict:
    """The request predicted for, and the default SLO class it would be held to."""
    slo = next(c for c in config.slo.classes if c.name == config.slo.default_class)
    return {
        **typical._asdict(),
        "slo_class": slo.name,
        "slo_ttft_s": slo.ttft_s,
        "slo_tpot_s": slo.tpot_s,
    }


def _row(scheduler: Scheduler, b: Backend) -> dict:
    health = scheduler.health
    return {
        "id": b.backend_id,
        "url": b.address,
        "gpu": b.gpu_type,
        "models": sorted(b.models),
        "capacity": round(b.capacity, 4),
        "state": b.state.value,
        "reason": b.reason,
        "in_flight": b.in_flight,
        "outstanding_s": round(b.outstanding, 4),
        "slowness": round(b.slowness, 3),
        "shared_s": round(b.shared, 4),
        "breaker": health.breaker(b.backend_id).state.value,
        "ejected": health.outliers.is_ejected(b.backend_id),
    }
