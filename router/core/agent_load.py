"""Agents' load reports merged with the router's own ledger (pure: times are arguments).

The ledger is the primary signal: it knows this router's requests the moment they are sent.
What it cannot see is work other routers put on the same engine; an agent's report shows
it as running + waiting beyond this router's in-flight count. That surplus, priced at the
mean cost of a request on the backend, becomes the backend's `external` work. A report
older than `stale_after_s` says nothing any more: external work drops to zero and the
ledger alone decides.

A stream is opened for one Consul member, at the address that member's Meta names. A report
speaks for that member only if it names it (`backend_id`, the agent's service ID) and, with
a load-stream token, carries the agent's proof (gpuroute/load_auth.py): another agent's
stream, pointed at by a forged entry, vouches for nothing."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from gpuroute.router.core.backend import Backend

SERVING_HEALTH = frozenset({"passing", "warning"})  # agent health states that take traffic


@dataclass(frozen=True, slots=True)
class AgentReport:
    seq: int
    timestamp: float  # agent's wall clock when sampled
    running: int
    waiting: int
    kv_cache_usage: float
    gpu_util: float
    throttled: bool
    health: str
    received_at: float  # router's monotonic clock
    # the engine's counters since it started (0 where it exports none)
    prefix_cache_hits: float = 0.0
    prefix_cache_queries: float = 0.0
    preemptions: float = 0.0
    # LoRA adapters running or waiting in the engine, and its adapter slots (0: unknown)
    lora_adapters: frozenset[str] = frozenset()
    max_loras: int = 0


def report_refusal(member_id: str, named: str, proof: bytes, expected: bytes | None) -> str | None:
    """Why a report on the stream opened for `member_id` may not speak for it (None: it
    may). `expected` is the agent's proof for this stream, None without a token."""
    if named != member_id:
        return "other_backend"
    if expected is not None and not hmac.compare_digest(proof, expected):
        return "no_proof"
    return None


def follow_adapters(backend: Backend, report: AgentReport) -> None:
    """The engine's adapters as its agent last reported them, for adapter affinity
    (router/core/policies/adapter_affinity.py)."""
    backend.adapters = report.lora_adapters
    backend.adapter_slots = report.max_loras


class AgentLoadView:
    def __init__(self, stale_after_s: float = 1.0) -> None:
        if stale_after_s <= 0:
            raise ValueError("stale_after_s must be > 0")
        self.stale_after_s = stale_after_s
        self.reports: dict[str, AgentReport] = {}

    def record(self, backend_id: str, report: AgentReport) -> bool:
        """Keep a report unless it is older than the one held (seq restarts with the agent,
        so order by the sample time). Returns whether the agent's health changed."""
        held = self.reports.get(backend_id)
        if held is not None and report.timestamp < held.timestamp:
            return False
        self.reports[backend_id] = report
        return held is None or held.health != report.health

    def forget(self, backend_id: str) -> None:
        self.reports.pop(backend_id, None)

    def fresh(self, backend_id: str, now: float) -> AgentReport | None:
        report = self.reports.get(backend_id)
        if report is None or now - report.received_at > self.stale_after_s:
            return None
        return report

    def vouches(self, backend_id: str, now: float) -> bool:
        """The agent streams fresh reports of a host that is serving."""
        report = self.fresh(backend_id, now)
        return report is not None and report.health in SERVING_HEALTH

    def age(self, backend_id: str, wall_now: float) -> float | None:
        """How old the freshest load this router holds for the backend is (agent clock)."""
        report = self.reports.get(backend_id)
        return None if report is None else max(0.0, wall_now - report.timestamp)

    def external_work(self, backend: Backend, now: float, mean_cost_s: float) -> float:
        report = self.fresh(backend.backend_id, now)
        if report is None:
            return 0.0
        others = report.running + report.waiting - backend.in_flight
        return max(0, others) * mean_cost_s

    def update(self, backends, now: float, mean_cost_s) -> int:
        """Refresh every backend's external work; returns how many have stale or no reports."""
        stale = 0
        for backend in backends:
            if backend.backend_id not in self.reports:
                continue
            if self.fresh(backend.backend_id, now) is None:
                stale += 1
            backend.external = self.external_work(backend, now, mean_cost_s(backend))
        return stale
