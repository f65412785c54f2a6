"""The global tier's part of a trace: its decision (region chosen, the order behind it, why,
and the residency rules that applied) on the request span gpuroute/tracing.py opens, and
each continuation of its stream in another region, an event of that span."""

from __future__ import annotations

from gpuroute.global_.core.policy import GlobalDecision
from gpuroute.global_.core.residency import ANY, Allowed
from opentelemetry import trace

from gpuroute.tracing import TRACER


def global_decision(decision: GlobalDecision, allowed: Allowed, tenant: str | None) -> None:
    """The decision's terms as attributes of the request's span (where one records)."""
    if TRACER.get() is None:
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    places = "*" if allowed.jurisdictions is ANY else ",".join(sorted(allowed.jurisdictions))
    span.set_attributes(
        {
            "gpuroute.region": decision.region or "",
            "gpuroute.order": ",".join(decision.order),
            "gpuroute.reason": decision.reason,
            "gpuroute.residency": places,
            "gpuroute.residency_rules": ",".join(allowed.rules),
            "gpuroute.tenant": tenant or "",
        }
    )
    span.add_event("decision", {"gpuroute.region": decision.region or ""})


def continuation_event(tries: int, tokens_before: int, region: str | None) -> None:
    """A continuation of the request's broken stream: the region it went on in ("" where
    none would take it)."""
    if TRACER.get() is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        attributes = {"gpuroute.continuation": tries, "gpuroute.tokens_before": tokens_before,
                      "gpuroute.region": region or ""}  # fmt: skip
        span.add_event("continuation", attributes)
